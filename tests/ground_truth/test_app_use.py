"""The labeling app as its people use it: error pages in HTML for people and JSON for the API, progress
and the gold score (recomputed here from what was served), the reviewer's undo and the majority answer,
the admin's account form stating the password rule, and each task's answer rule as its queue applies it."""

from __future__ import annotations

import httpx
import pytest

from ground_truth import queue, review
from ground_truth.db import connect
from ground_truth.schema import TaskSpec
from ground_truth.seen import GOLD_SCORE_STEP, majority
from tests.ground_truth.conftest import PASSWORD, add_task, browser, login, make_accounts, serve_app

TASK = TaskSpec(name="violation", question="Copy?", labels=["violation", "ok"], annotators_per_item=1, gold_share=0.5)
GOLD = {f"g{i}": ("ok" if i % 3 else "violation") for i in range(8)}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('use') / 'labels.db'}"
    engine = connect(url)
    make_accounts(engine, 2, reviewers=2)
    add_task(engine, TASK, [str(i) for i in range(20)], gold=GOLD)
    with serve_app(url) as base_url:
        yield base_url, engine


def test_people_get_html_error_pages_and_the_api_json(app):
    base_url, _ = app
    with browser(base_url, "reviewer0") as person:
        for path, status, words in (
            ("/review/nope", 404, "no task"),
            ("/admin", 403, "may not open this page"),
            ("/nowhere", 404, "Not Found"),
        ):
            page = person.get(path)
            assert page.status_code == status and page.headers["content-type"].startswith("text/html"), path
            assert words in page.text and '<a href="/">' in page.text, page.text
        api = person.get("/api/tasks/nope/disputes")
        assert api.status_code == 404 and api.json() == {"detail": "no task 'nope'"}
        listed = person.get("/api/tasks")  # no browser keeps an API answer to show again on Back
        assert listed.status_code == 200 and listed.headers["cache-control"] == "no-store"
        assert person.get("/api/nowhere").json() == {"detail": "Not Found"}
    with httpx.Client(base_url=base_url) as anonymous:
        token = anonymous.get("/login").text.split('name="csrf-token" content="')[1].split('"')[0]
        incomplete = anonymous.post("/login", data={"username": "reviewer0", "csrf": token})
        assert incomplete.status_code == 422 and "password" in incomplete.text
        assert incomplete.headers["content-type"].startswith("text/html")


def test_progress_and_gold_score_match_what_was_served(app):
    base_url, _ = app
    with login(base_url, "annotator0") as client:
        served: list[str] = []
        item = client.get("/api/tasks/violation/next").json()["item"]
        for answered in range(1, 15):
            served.append(item["key"])
            body = {"item_id": item["item_id"], "label": "ok"}
            item = client.post("/api/tasks/violation/answers", json=body).json()["item"]
            shown = client.get("/api/tasks/violation/progress").json()
            through = answered // GOLD_SCORE_STEP * GOLD_SCORE_STEP
            gold = [key for key in served[:through] if key.startswith("gold-")]
            right = sum(GOLD[key.removeprefix("gold-")] == "ok" for key in gold)
            regular = sum(not key.startswith("gold-") for key in served)
            assert shown == {
                "done": answered,
                "remaining": 20 - regular,  # the item now held counts: it is still to be done
                "gold_scored": len(gold),
                "gold_correct": right,
                "gold_accuracy": right / len(gold) if gold else None,
                "scored_through": through,
            }, (answered, served)
        assert any(key.startswith("gold-") for key in served[:GOLD_SCORE_STEP])


def test_a_reviewer_undoes_their_own_verdict(app):
    base_url, engine = app
    spec = TaskSpec(name="pair", question="Copy?", labels=["violation", "ok"], annotators_per_item=2, gold_share=0)
    task = add_task(engine, spec, ["x"])
    for person, label in (("annotator0", "ok"), ("annotator1", "violation")):
        with login(base_url, person) as client:
            item = client.get("/api/tasks/pair/next").json()["item"]
            client.post("/api/tasks/pair/answers", json={"item_id": item["item_id"], "label": label})
    (item_id,) = [s.item_id for s in review.disputes(engine, task)]
    with login(base_url, "reviewer0") as first, login(base_url, "reviewer1") as second:
        assert first.post("/api/tasks/pair/verdicts", json={"item_id": item_id, "label": "ok"}).status_code == 200
        assert review.disputes(engine, task) == []
        theirs = second.delete(f"/api/tasks/pair/verdicts/{item_id}")
        assert theirs.status_code == 409 and "another reviewer" in theirs.json()["detail"]
        assert first.delete(f"/api/tasks/pair/verdicts/{item_id}").json() == {"item_id": item_id, "verdict": None}
        assert [s.item_id for s in review.disputes(engine, task)] == [item_id]  # open again
        again = first.delete(f"/api/tasks/pair/verdicts/{item_id}")
        assert again.status_code == 409 and "no verdict" in again.json()["detail"]
    with browser(base_url, "reviewer0") as page:
        html = page.get("/review/pair").text
    assert html.count("&#9733; majority") == 0  # one each way: no majority to mark


def test_majority_is_the_most_given_answer_and_none_on_a_tie():
    assert majority({"a": "ok", "b": "ok", "c": "violation"}) == "ok"
    assert majority({"a": "ok", "b": "violation"}) is None
    assert majority({"a": "ok", "b": "violation", "c": "spam", "d": "spam"}) == "spam"
    assert majority({}) is None


def test_the_admin_form_states_and_checks_the_password_rule(app):
    base_url, engine = app
    with browser(base_url, "admin0") as admin:
        page = admin.get("/admin")
        assert "at least 8 characters" in page.text and 'minlength="8"' in page.text
        form = {"username": "newbie", "role": "annotator", "csrf": admin.csrf}
        short = admin.post("/admin/accounts", data={**form, "password": "short"})
        assert short.status_code == 422 and "at least 8 characters" in short.text
        made = admin.post("/admin/accounts", data={**form, "password": PASSWORD})
        assert made.status_code == 303 and made.headers["location"] == "/admin?created=newbie"
        twice = admin.post("/admin/accounts", data={**form, "password": PASSWORD})
        assert twice.status_code == 409 and "exists" in twice.text
        forged = admin.post("/admin/accounts", data={**form, "username": "forged", "csrf": "x", "password": "x" * 9})
        assert forged.status_code == 403
    with browser(base_url, "newbie") as newbie:
        assert newbie.get("/").status_code == 200
    with browser(base_url, "annotator0") as annotator:
        denied = annotator.post("/admin/accounts", data={**form, "csrf": annotator.csrf, "password": "x" * 9})
        assert denied.status_code == 403


def test_the_admin_page_states_each_tasks_answer_rule(app):
    base_url, engine = app
    adaptive = TaskSpec(name="adaptive_copy", question="Copy?", labels=["violation", "ok"], adaptive=True)
    queue.create_task(engine, adaptive)
    with browser(base_url, "admin0") as admin:
        tasks = admin.get("/admin").text.split("<li>violation: ")[1].split("</ul>")[0]
    assert tasks.startswith("k=1, labels violation, ok")  # TASK asks each item once
    assert "adaptive_copy: adaptive, until 90% sure or 5 answers, labels violation, ok" in tasks
    assert "adaptive_copy: k=" not in tasks
