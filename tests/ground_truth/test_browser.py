"""The labeling app end to end in a real headless Chromium (Playwright driving Debian's chromium):
sign in, label with the keyboard (a held key answers once), skip, undo, Back and Forward, an expired
session and signing in back to the task, the item beside its matched original, review and adjudicate
with the reviewer's keys and undo, and 403s for what a role may not open. Everything the pages load is
served by the app (no CDN). Screenshots of each step are kept in build/test-artifacts/."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image
from playwright.sync_api import expect, sync_playwright

from ground_truth import accounts, originals, queue, review
from ground_truth.db import connect
from ground_truth.originals import OriginalIn
from ground_truth.schema import ItemIn, TaskSpec
from tests.ground_truth.conftest import PASSWORD, login, make_accounts, serve_app

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts" / "labeling"
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


def keep(page, name: str) -> None:
    """A screenshot of the page as a test artefact (for a person to look at when a test fails)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)
    assert (ARTIFACTS / f"{name}.png").stat().st_size > 0


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
        keep(page, "label-first-item")
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
        expect(dispute.locator(".majority")).to_have_count(0)  # one answer each way: no majority
        expect(dispute).to_contain_text("annotator0: ok")
        expect(dispute).to_contain_text("annotator1: violation")
        keep(reviewer, "review-dispute")
        dispute.locator("button[data-label=violation]").click()
        expect(dispute).to_be_hidden()
        expect(reviewer.locator("#open-count")).to_have_text("0")
        browser.close()
    states = {s.title: s for s in review.item_states(engine, task)}
    assert states[first].verdict == "violation" and states[first].gold_label is None
    assert all(r.startswith(base_url) for r in requests), [r for r in requests if not r.startswith(base_url)]


@pytest.fixture
def pair_app(tmp_path):
    """A copy-detection task of k=3 whose items each carry the original the detector matched them with."""
    media = tmp_path / "landing"
    (media / "thumbnails").mkdir(parents=True)
    url = f"sqlite:///{tmp_path / 'labels.db'}"
    engine = connect(url)
    make_accounts(engine, 3)
    spec = TASK.model_copy(update={"annotators_per_item": 3})
    task = queue.create_task(engine, spec)
    items, matches = [], []
    for i in range(4):
        for name, colour in ((f"{i}.png", (30, 30, 200)), (f"original-{i}.png", (30, 200, 30))):
            buffer = io.BytesIO()
            Image.new("RGB", (24, 24), colour).save(buffer, format="PNG")
            (media / "thumbnails" / name).write_bytes(buffer.getvalue())
        items.append(ItemIn(key=str(i), queue="detector_flagged", title=f"Copy {i}", thumbnail=f"thumbnails/{i}.png"))
        matches.append(
            OriginalIn(
                key=str(i),
                original_key=str(100 + i),
                original_title=f"Original {i}",
                original_thumbnail=f"thumbnails/original-{i}.png",
                similarity=0.9 + i / 100,
            )
        )
    queue.add_items(engine, task, items)
    originals.record(engine, task, matches)
    with serve_app(url, media) as base_url:
        yield base_url, engine, task


def answered(engine, task, person: str) -> dict[str, str]:
    return {s.title: s.answers[person] for s in review.item_states(engine, task) if person in s.answers}


@pytest.mark.services  # the app's server and Chromium
def test_keys_back_forward_expiry_and_the_matched_original_in_chromium(pair_app):
    base_url, engine, task = pair_app
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context()
        page = context.new_page()
        sign_in(page, base_url, "annotator0")
        page.goto(f"{base_url}/label/violation")
        title = page.locator("#title")
        expect(title).to_have_text("Copy 0")
        expect(page.locator("#original-title")).to_have_text("Matched original: Original 0")
        expect(page.locator("#similarity")).to_have_text("Similarity 0.900")
        for image in page.locator("#item img").all():  # both thumbnails served: the item's and the original's
            expect(image).to_have_js_property("complete", True)
            assert image.evaluate("img => img.naturalWidth") == 24
        expect(page.locator("#progress")).to_contain_text("Done 0 · about 4 left")
        keep(page, "label-side-by-side")
        boxes = [b.bounding_box() for b in page.locator("#choices button, #skip, #undo").all()]
        assert len(boxes) == 4 and all(b["height"] >= 44 and b["width"] >= 100 for b in boxes), boxes  # large targets
        violation, ok = boxes[:2]
        assert ok["x"] - (violation["x"] + violation["width"]) >= 8, boxes  # apart, not touching

        page.keyboard.down("2")  # held: the first press answers ...
        expect(title).to_have_text("Copy 1")
        for _ in range(4):
            page.keyboard.down("2")  # ... and the key's repeats answer nothing
        page.keyboard.up("2")
        page.keyboard.press("s")  # a new press acts (it would be lost behind a repeat's request)
        expect(page.locator("#status")).to_have_text("Skipped.")
        expect(title).to_have_text("Copy 2")
        assert answered(engine, task, "annotator0") == {"Copy 0": "ok"}
        expect(page.locator("#progress")).to_contain_text("Done 1")

        page.click("header a[href='/']")  # away and Back: the page shows the item held now
        page.wait_for_url(f"{base_url}/")
        page.go_back()
        expect(title).to_have_text("Copy 2")
        page.click("#choices button[data-label=violation]")  # the large button answers as the key does
        expect(title).to_have_text("Copy 3")
        page.go_back()  # to the home page, and Forward: the current item, never an answered one
        page.go_forward()
        expect(title).to_have_text("Copy 3")
        keep(page, "label-after-back-forward")
        page.keyboard.press("1")
        expect(page.locator("#done")).to_be_visible()
        assert answered(engine, task, "annotator0") == {"Copy 0": "ok", "Copy 2": "violation", "Copy 3": "violation"}

        page.click("#undo")  # the undo button: the last answer again
        expect(title).to_have_text("Copy 3")
        token = next(c["value"] for c in context.cookies() if c["name"] == "gt_session")
        accounts.sign_out(engine, token)  # the session ends (as on expiry) while the page is open
        page.keyboard.press("2")
        expect(page.locator("#status")).to_contain_text("Your session has ended.")
        keep(page, "label-session-ended")
        page.click("#sign-in-again")
        page.fill("#username", "annotator0")
        page.fill("#password", PASSWORD)
        page.click("#sign-in")
        page.wait_for_url(f"{base_url}/label/violation")  # back where the annotator was
        expect(title).to_have_text("Copy 3")
        page.keyboard.press("2")
        expect(page.locator("#done")).to_be_visible()

        page.click("#sign-out")
        page.wait_for_url(f"{base_url}/login")
        page.go_back()  # no signed-in page from the cache after signing out
        page.wait_for_url(f"{base_url}/login?next=%2Flabel%2Fviolation")
        browser.close()
    assert answered(engine, task, "annotator0") == {"Copy 0": "ok", "Copy 2": "violation", "Copy 3": "ok"}


@pytest.mark.services  # the app's server and Chromium
def test_reviewer_keys_undo_and_the_majority_in_chromium(pair_app):
    base_url, engine, task = pair_app
    for person, labels in (
        ("annotator0", ["ok", "ok", "violation", "ok"]),
        ("annotator1", ["ok", "violation", "violation", "ok"]),
        ("annotator2", ["violation", "violation", "ok", "ok"]),
    ):
        with login(base_url, person) as client:
            item = client.get("/api/tasks/violation/next").json()["item"]
            while item is not None:
                label = labels[int(item["key"])]
                item = client.post(
                    "/api/tasks/violation/answers", json={"item_id": item["item_id"], "label": label}
                ).json()["item"]
    states = {s.title: s for s in review.item_states(engine, task)}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        sign_in(page, base_url, "reviewer0")
        page.goto(f"{base_url}/review/violation")
        disputes = page.locator(".dispute:visible")
        expect(disputes).to_have_count(3)  # items 0-2 split 2:1; item 3 unanimous
        first = page.locator(f"#dispute-{states['Copy 0'].item_id}")
        expect(first.locator("button.majority")).to_have_attribute("data-label", "ok")  # 2 of 3 said ok
        expect(first.locator(".original img")).to_have_count(1)
        expect(first).to_contain_text("similarity 0.900")
        expect(first).to_have_class("dispute selected")
        keep(page, "review-majority")
        page.keyboard.press("2")  # the selected (first) dispute: ok
        expect(disputes).to_have_count(2)
        expect(page.locator("#open-count")).to_have_text("2")
        page.keyboard.press("j")  # from Copy 1 to Copy 2
        page.keyboard.press("1")  # Copy 2: violation
        expect(disputes).to_have_count(1)
        page.keyboard.press("u")  # take back the last verdict: Copy 2 is open again
        expect(disputes).to_have_count(2)
        expect(page.locator(f"#dispute-{states['Copy 2'].item_id}")).to_have_class("dispute selected")
        keep(page, "review-after-undo")
        page.keyboard.press("2")  # Copy 2: ok, this time
        expect(disputes).to_have_count(1)
        browser.close()
    verdicts = {s.title: s.verdict for s in review.item_states(engine, task)}
    assert verdicts == {"Copy 0": "ok", "Copy 1": None, "Copy 2": "ok", "Copy 3": None}
