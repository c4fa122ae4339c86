"""Server-rendered pages (plain HTML, escaped) and the JSON shapes of review data."""

from __future__ import annotations

from dataclasses import asdict
from html import escape
from urllib.parse import urlencode

from ground_truth.accounts import Account
from ground_truth.originals import Original
from ground_truth.queue import Task
from ground_truth.review import ItemState, TaskQuality
from ground_truth.schema import Role
from ground_truth.seen import majority

LOGIN_HINT = "at least 8 characters"  # accounts.create_account's rule, stated where a password is chosen


def _page(title: str, body: str, csrf: str, account: Account | None = None, script: str | None = None) -> str:
    who = (
        (
            f'<form method="post" action="/logout" class="who">{_csrf_field(csrf)}{escape(account.username)} '
            f'({account.role.value}) <button type="submit" id="sign-out">Sign out</button></form>'
        )
        if account
        else ""
    )
    tag = f'<script src="/static/{script}" defer></script>' if script else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="csrf-token" content="{escape(csrf)}">'
        f'<link rel="stylesheet" href="/static/style.css">{tag}</head>'
        f'<body><header><a href="/">mlplane labeling</a>{who}</header><main>{body}</main></body></html>'
    )


def _csrf_field(csrf: str) -> str:
    return f'<input type="hidden" name="csrf" value="{escape(csrf)}">'


def local_path(target: str | None) -> str:
    """Where to go after signing in: a path of this site only (never '//elsewhere' or 'https://...')."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")) or not target.isprintable():
        return "/"
    return target


def login_url(back: str, error: bool = False) -> str:
    query = {"next": back} if local_path(back) != "/" else {}
    if error:
        query["error"] = "1"
    return "/login" + (f"?{urlencode(query)}" if query else "")


def login(error: str | None, csrf: str, back: str = "/", retry_after: int | None = None) -> str:
    problem = '<p class="error" id="error">Wrong username or password.</p>' if error else ""
    if retry_after is not None:
        problem = f'<p class="error" id="error">Too many sign-in attempts: try again in {retry_after} s.</p>'
    return _page(
        "Sign in",
        f"""<h1>Sign in</h1>{problem}
<form method="post" action="/login" class="login">{_csrf_field(csrf)}
<input type="hidden" name="next" value="{escape(back)}">
<label>Username <input name="username" id="username" autocomplete="username" required autofocus></label>
<label>Password <input name="password" id="password" type="password" autocomplete="current-password" required></label>
<button type="submit" id="sign-in" class="big">Sign in</button></form>
<p class="hint">Passwords are {LOGIN_HINT}; an admin sets up accounts.</p>""",
        csrf,
    )


def error(status: int, detail: str, path: str) -> str:
    titles = {401: "Sign in first", 403: "Not allowed", 404: "Not found", 409: "Conflict", 429: "Too many attempts"}
    title = titles.get(status, "Something went wrong" if status >= 500 else "Cannot do that")
    return _page(
        f"{status} {title}",
        f"""<h1>{escape(title)}</h1><p id="problem">{escape(detail)}</p>
<p><a href="/">Back to the tasks</a> or <a href="{escape(login_url(path))}">sign in</a> as someone else.</p>""",
        "",
    )


def home(account: Account, tasks: list[Task], csrf: str) -> str:
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
    body = f"<h1>Tasks</h1><ul class=tasks>{''.join(rows) or '<li>none yet</li>'}</ul>{admin}"
    return _page("Tasks", body, csrf, account)


def label(account: Account, task: Task, csrf: str) -> str:
    spec = task.spec
    keys = "".join(f"<kbd>{i + 1}</kbd> {escape(label)} " for i, label in enumerate(spec.labels or []))
    hint = keys if spec.labels else "type the answer, <kbd>Enter</kbd> to send"
    return _page(
        f"Label {spec.name}",
        f"""<h1>{escape(spec.question)}</h1>
<details><summary>Instructions</summary><p>{escape(spec.instructions)}</p></details>
<p id="progress" aria-live="polite"></p>
<section id="labeler" data-task="{escape(spec.name)}">
<div id="item"><p id="loading">Loading ...</p></div>
<div id="choices" class="actions"></div>
<div class="actions"><button type="button" id="skip" class="big secondary">Skip <kbd>s</kbd></button>
<button type="button" id="undo" class="big secondary">Undo last answer <kbd>u</kbd></button></div>
<p class="keys">{hint} <kbd>s</kbd> skip <kbd>u</kbd> undo last answer</p>
<p id="status" role="status"></p></section>""",
        csrf,
        account,
        "label.js",
    )


def item_card(state: ItemState, original: Original | None = None) -> str:
    image = (
        f'<img src="/media/{escape(state.thumbnail)}" alt="item" width="128" height="128">' if state.thumbnail else ""
    )
    card = (
        f'<figure class="item">{image}<figcaption><h2>{escape(state.title)}</h2>'
        f"<p>{escape(state.description)}</p></figcaption></figure>"
    )
    if original is None:
        return card
    theirs = (
        f'<img src="{escape(original.thumbnail_url)}" alt="matched original" width="128" height="128">'
        if original.thumbnail_url
        else ""
    )
    return (
        f'<div class="pair">{card}<figure class="original">{theirs}<figcaption>'
        f"<h2>Matched original: {escape(original.title)}</h2><p>similarity {original.similarity:.3f}</p>"
        "</figcaption></figure></div>"
    )


def review(
    account: Account,
    task: Task,
    open_disputes: list[ItemState],
    quality: TaskQuality,
    matched: dict[int, Original | None],
    csrf: str,
) -> str:
    rows = [_dispute(state, task.spec.labels or [], matched.get(state.item_id)) for state in open_disputes]
    keys = "".join(f"<kbd>{i + 1}</kbd> {escape(b)} " for i, b in enumerate(task.spec.labels or []))
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
<p class="keys">On the selected dispute: {keys}<kbd>j</kbd>/<kbd>k</kbd> next/previous,
<kbd>u</kbd> undo the last verdict. &#9733; marks the majority answer.</p>
<p id="last-verdict" hidden><span id="last-verdict-text"></span>
<button type="button" id="undo-verdict" class="big secondary">Undo verdict <kbd>u</kbd></button></p>
<section id="disputes" data-task="{escape(task.spec.name)}">{"".join(rows) or "<p>No open disputes.</p>"}</section>
<h2>Annotators</h2><table><tr><th>annotator</th><th>answers</th><th>kappa vs resolved</th><th>gold answered</th>
<th>gold accuracy (95% interval)</th></tr>{people}</table>""",
        csrf,
        account,
        "review.js",
    )


def _dispute(state: ItemState, labels: list[str], original: Original | None) -> str:
    top = majority(state.answers)
    star = ' <span class="majority" title="majority answer">&#9733; majority</span>'
    answers = "".join(
        f"<li{' class=majority-answer' if label == top else ''}><b>{escape(who)}</b>: {escape(label)}"
        f"{star if label == top else ''}</li>"
        for who, label in sorted(state.answers.items())
    )
    verdict = "".join(
        f'<button type="button" class="big{" majority" if b == top else ""}" data-item="{state.item_id}" '
        f'data-label="{escape(b)}"><kbd>{i + 1}</kbd> {escape(b)}{" &#9733;" if b == top else ""}</button>'
        for i, b in enumerate(labels)
    )
    return (
        f'<article class="dispute" id="dispute-{state.item_id}" tabindex="-1">{item_card(state, original)}'
        f'<ul class="answers">{answers}</ul><div class="verdict actions">Verdict: {verdict}</div></article>'
    )


def admin(
    account: Account,
    accounts: list[Account],
    tasks: list[Task],
    csrf: str,
    created: str | None = None,
    problem: str | None = None,
) -> str:
    people = "".join(f"<li>{escape(a.username)}: {a.role.value}</li>" for a in accounts)
    listed = "".join(
        f"<li>{escape(t.spec.name)}: {t.spec.answers_rule}, labels "
        f"{escape(', '.join(t.spec.labels or ['free text']))}</li>"
        for t in tasks
    )
    note = f'<p class="error" id="error">{escape(problem)}</p>' if problem else ""
    if created and not problem:
        note = f'<p id="created">Account {escape(created)} created.</p>'
    roles = "".join(f'<option value="{r.value}">{r.value}</option>' for r in Role)
    form = f"""<h2>New account</h2>{note}
<form method="post" action="/admin/accounts" class="login">{_csrf_field(csrf)}
<label>Username (letters, digits, '.', '_' or '-')
 <input name="username" id="new-username" required maxlength="64"></label>
<label>Password ({LOGIN_HINT}) <input name="password" id="new-password" type="password" minlength="8" required
 autocomplete="new-password"></label>
<label>Role <select name="role" id="new-role">{roles}</select></label>
<button type="submit" class="big" id="create-account">Create account</button></form>"""
    return _page(
        "Admin",
        f"<h1>Accounts</h1><ul>{people}</ul>{form}<h1>Tasks</h1><ul>{listed}</ul>"
        "<p>Create tasks with <code>mlplane labeling</code> or the JSON API.</p>",
        csrf,
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
