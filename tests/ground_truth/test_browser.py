"""The labeling app end to end in a real headless Chromium (Playwright driving Debian's chromium):
sign in, label with the keyboard, skip, undo, review and adjudicate, and 403s for what a role may not
open. Everything the pages load is served by the app (no CDN)."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from playwright.sync_api import expect, sync_playwright

from ground_truth import queue, review
from ground_truth.db import connect
from ground_truth.schema import ItemIn, TaskSpec
from tests.ground_truth.conftest import PASSWORD, login, make_accounts, serve_app

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TASK = TaskSpec(
    name="violation",
    question="Is this a copy?",
    labels=["violation", "ok"],
    annotators_per_item=2,
    gold_share=0.0,
    instructions="1 = violation, 2 = ok",
)


@pytest.fixture
def app(tmp_path):
    media = tmp_path / "landing"
    (media / "thumbnails").mkdir(parents=True)
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buffer, format="PNG")
    url = f"sqlite:///{tmp_path / 'labels.db'}"
    engine = connect(url)
    make_accounts(engine, 2)
    task = queue.create_task(engine, TASK)
    items = []
    for i in range(3):
        (media / "thumbnails" / f"{i}.png").write_bytes(buffer.getvalue())
        items.append(
            ItemIn(
                key=str(i),
                queue="audit",
                title=f"Teapot {i} <script>alert(1)</script>",
                description=f"A teapot, number {i}",
                thumbnail=f"thumbnails/{i}.png",
                model_score=0.9,
            )
        )
    queue.add_items(engine, task, items)
    with serve_app(url, media) as base_url:
        yield base_url, engine, task


def sign_in(page, base_url, username):
    page.goto(f"{base_url}/login")
    page.fill("#username", username)
    page.fill("#password", PASSWORD)
    page.click("#sign-in")
    page.wait_for_url(f"{base_url}/")


@pytest.mark.services  # the app's server and Chromium
def test_label_review_and_forbidden_pages_in_chromium(app):
    base_url, engine, task = app
    requests = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.on("request", lambda r: requests.append(r.url))
        page.on("dialog", lambda d: pytest.fail(f"a script from an item ran: {d.message}"))
        sign_in(page, base_url, "annotator0")
        page.click("a[href='/label/violation']")
        title = page.locator("#title")
        expect(title).to_contain_text("Teapot")
        first = title.text_content()
        assert page.locator("#score").count() == 0  # this task hides the model's score
        assert page.locator("#item img").evaluate("img => img.naturalWidth") == 32  # thumbnail served
        page.keyboard.press("1")  # violation
        expect(title).not_to_have_text(first)
        page.keyboard.press("u")  # undo: the first item again
        expect(title).to_have_text(first)
        expect(page.locator("#status")).to_contain_text("taken back")
        page.keyboard.press("2")  # ok, instead
        expect(title).not_to_have_text(first)
        second = title.text_content()
        page.keyboard.press("s")  # skip the second
        expect(title).not_to_have_text(second)
        page.keyboard.press("1")
        expect(page.locator("#done")).to_be_visible()
        forbidden = page.goto(f"{base_url}/review/violation")
        assert forbidden.status == 403
        api = page.evaluate("async () => (await fetch('/api/accounts')).status")
        assert api == 403
        states = {s.title: s for s in review.item_states(engine, task)}
        assert states[first].answers == {"annotator0": "ok"}
        assert len([s for s in states.values() if s.answers]) == 2

        with login(base_url, "annotator1") as other:  # 'violation' throughout: disagrees on the first item only
            item = other.get("/api/tasks/violation/next").json()["item"]
            while item is not None:
                item = other.post(
                    "/api/tasks/violation/answers", json={"item_id": item["item_id"], "label": "violation"}
                ).json()["item"]

        reviewer = browser.new_page()
        sign_in(reviewer, base_url, "reviewer0")
        assert reviewer.goto(f"{base_url}/label/violation").status == 403
        reviewer.goto(f"{base_url}/review/violation")
        dispute = reviewer.locator(".dispute")
        expect(dispute).to_have_count(1)
        expect(dispute).to_contain_text("annotator0: ok")
        expect(dispute).to_contain_text("annotator1: violation")
        dispute.locator("button[data-label=violation]").click()
        expect(dispute).to_have_count(0)
        expect(reviewer.locator("#open-count")).to_have_text("0")
        browser.close()
    states = {s.title: s for s in review.item_states(engine, task)}
    assert states[first].verdict == "violation" and states[first].gold_label is None
    assert all(r.startswith(base_url) for r in requests), [r for r in requests if not r.startswith(base_url)]
