"""Server-rendered pages (plain HTML, escaped) and the JSON shapes of review data."""

from __future__ import annotations

from dataclasses import asdict
from html import escape

from ground_truth.accounts import Account
from ground_truth.queue import Task
from ground_truth.review import ItemState, TaskQuality
from ground_truth.schema import Role


def _page(title: str, body: str, account: Account | None = None, script: str | None = None) -> str:
    who = (
        (
            f'<form method="post" action="/logout" class="who">{escape(account.username)} ({account.role.value}) '
            f'<button type="submit">Sign out</button></form>'
        )
        if account
        else ""
    )
    tag = f'<script src="/static/{script}" defer></script>' if script else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f'<link rel="stylesheet" href="/static/style.css">{tag}</head>'
        f'<body><header><a href="/">mlplane labeling</a>{who}</header><main>{body}</main></body></html>'
    )


def login(error: str | None, retry_after: int | None = None) -> str:
    problem = '<p class="error" id="error">Wrong username or password.</p>' if error else ""
    if retry_after is not None:
        problem = f'<p class="error" id="error">Too many sign-in attempts: try again in {retry_after} s.</p>'
    return _page(
        "Sign in",
        f"""<h1>Sign in</h1>{problem}
<form method="post" action="/login" class="login">
<label>Username <input name="username" id="username" autocomplete="username" required autofocus></label>
<label>Password <input name="password" id="password" type="password" autocomplete="current-password" required></label>
<button type="submit" id="sign-in">Sign in</button></form>""",
    )


def home(account: Account, tasks: list[Task]) -> str:
    rows = []
    for task in tasks:
        name = escape(task.spec.name)
        links = {
            Role.annotator: f'<a href="/label/{name}">label</a>',
            Role.reviewer: f'<a href="/review/{name}">review</a>',
            Role.admin: f'<a href="/review/{name}">review</a>',
        }[account.role]
        rows.append(f"<li>{name}: {escape(task.spec.question)} ({links})</li>")
    admin = '<p><a href="/admin">Accounts and tasks</a></p>' if account.role == Role.admin else ""
    return _page("Tasks", f"<h1>Tasks</h1><ul class=tasks>{''.join(rows) or '<li>none yet</li>'}</ul>{admin}", account)


def label(account: Account, task: Task) -> str:
    spec = task.spec
    keys = "".join(f"<kbd>{i + 1}</kbd> {escape(label)} " for i, label in enumerate(spec.labels or []))
    hint = keys if spec.labels else "type the answer, <kbd>Enter</kbd> to send"
    return _page(
        f"Label {spec.name}",
        f"""<h1>{escape(spec.question)}</h1>
<details><summary>Instructions</summary><p>{escape(spec.instructions)}</p></details>
<section id="labeler" data-task="{escape(spec.name)}">
<div id="item"><p id="loading">Loading ...</p></div>
<p class="keys">{hint} <kbd>s</kbd> skip <kbd>u</kbd> undo last answer</p>
<p id="status" role="status"></p></section>""",
        account,
        "label.js",
    )


def item_card(state: ItemState) -> str:
    image = f'<img src="/media/{escape(state.thumbnail)}" alt="" width="128" height="128">' if state.thumbnail else ""
    return f"{image}<h2>{escape(state.title)}</h2><p>{escape(state.description)}</p>"


def review(account: Account, task: Task, open_disputes: list[ItemState], quality: TaskQuality) -> str:
    buttons = task.spec.labels or []
    rows = []
    for state in open_disputes:
        answers = "".join(
            f"<li><b>{escape(who)}</b>: {escape(label)}</li>" for who, label in sorted(state.answers.items())
        )
        verdict = "".join(
            f'<button type="button" data-item="{state.item_id}" data-label="{escape(b)}">{escape(b)}</button>'
            for b in buttons
        )
        rows.append(
            f'<article class="dispute" id="dispute-{state.item_id}">{item_card(state)}'
            f'<ul class="answers">{answers}</ul><div class="verdict">Verdict: {verdict}</div></article>'
        )
    alpha = "n/a" if quality.krippendorff_alpha is None else f"{quality.krippendorff_alpha:.3f}"
    people = "".join(
        f"<tr><td>{escape(a.annotator)}</td><td>{a.answers}</td><td>{_num(a.kappa_vs_resolved)}</td>"
        f"<td>{a.gold_answered}</td><td>{_num(a.gold_accuracy)}"
        f"{_interval(a.gold_accuracy_low, a.gold_accuracy_high)}</td></tr>"
        for a in quality.annotators
    )
    return _page(
        f"Review {task.spec.name}",
        f"""<h1>Review: {escape(task.spec.name)}</h1>
<p>{quality.items} items, {quality.complete} fully answered, {quality.resolved} resolved,
<span id="open-count">{len(open_disputes)}</span> disputes open. Krippendorff's alpha {alpha}.</p>
<section id="disputes" data-task="{escape(task.spec.name)}">{"".join(rows) or "<p>No open disputes.</p>"}</section>
<h2>Annotators</h2><table><tr><th>annotator</th><th>answers</th><th>kappa vs resolved</th><th>gold answered</th>
<th>gold accuracy (95% interval)</th></tr>{people}</table>""",
        account,
        "review.js",
    )


def admin(account: Account, accounts: list[Account], tasks: list[Task]) -> str:
    people = "".join(f"<li>{escape(a.username)}: {a.role.value}</li>" for a in accounts)
    listed = "".join(
        f"<li>{escape(t.spec.name)}: k={t.spec.annotators_per_item}, labels "
        f"{escape(', '.join(t.spec.labels or ['free text']))}</li>"
        for t in tasks
    )
    return _page(
        "Admin",
        f"<h1>Accounts</h1><ul>{people}</ul><h1>Tasks</h1><ul>{listed}</ul>"
        "<p>Create accounts and tasks with <code>mlplane labeling</code> or the JSON API.</p>",
        account,
    )


def dispute_json(state: ItemState) -> dict:
    return {
        "item_id": state.item_id,
        "key": state.key,
        "title": state.title,
        "answers": state.answers,
        "model_score": state.model_score,
        "queues": state.queues,
    }


def quality_json(quality: TaskQuality) -> dict:
    return asdict(quality)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f" ({low:.2f}-{high:.2f})"
