"""The labeling app against hostile callers: media only for items in a task (no other landing folder,
no path traversal), verdicts only on open disputes, authorization before existence, field limits."""

from __future__ import annotations

import httpx
import pytest

from ground_truth import originals, queue, review
from ground_truth.db import connect
from ground_truth.originals import OriginalIn
from ground_truth.pages import login_url
from ground_truth.schema import ItemIn, TaskSpec
from tests.ground_truth.conftest import add_task, login, make_accounts, serve_app

TASK = TaskSpec(name="violation", question="Copy?", labels=["violation", "ok"], annotators_per_item=2, gold_share=0.0)


@pytest.fixture(scope="module")
def media_app(tmp_path_factory):
    """A landing folder as the simulator writes it: thumbnails of queued and of unqueued items, and the
    private folders (users, abuse reports, chat messages) beside them."""
    root = tmp_path_factory.mktemp("media")
    landing = root / "landing"
    files = {
        "thumbnails/1.png": b"queued",
        "thumbnails/2.png": b"not queued",
        "thumbnails/3.png": b"matched original",
        "users/date=2026-01-01/part.parquet": b"users",
        "abuse_reports/date=2026-01-01/part.parquet": b"reports",
        "chat_messages/date=2026-01-01/part.parquet": b"chat",
    }
    for name, content in files.items():
        (landing / name).parent.mkdir(parents=True, exist_ok=True)
        (landing / name).write_bytes(content)
    (root / "secret.txt").write_bytes(b"outside")
    url = f"sqlite:///{root / 'labels.db'}"
    engine = connect(url)
    make_accounts(engine, 2)
    task = queue.create_task(engine, TASK)
    queue.add_items(engine, task, [ItemIn(key="1", queue="audit", thumbnail="thumbnails/1.png")])
    originals.record(
        engine,
        task,
        [
            OriginalIn(
                key="1",
                original_key="3",
                original_title="the first",
                original_thumbnail="thumbnails/3.png",
                similarity=0.97,
            )
        ],
    )
    with serve_app(url, landing) as base_url:
        yield base_url


def test_media_serves_an_item_and_its_original_only_to_whom_it_was_given(media_app):
    with login(media_app, "annotator0") as client:
        assert client.get("/media/thumbnails/1.png").status_code == 404  # not given to them yet
        shown = client.get("/api/tasks/violation/next").json()
        assert shown["item"]["thumbnail_url"] == "/media/thumbnails/1.png"
        assert shown["original"] == {
            "key": "3",
            "title": "the first",
            "thumbnail_url": "/media/thumbnails/3.png",
            "similarity": 0.97,
        }
        assert client.get("/media/thumbnails/1.png").content == b"queued"
        assert client.get("/media/thumbnails/3.png").content == b"matched original"
    with login(media_app, "annotator1") as other:  # never given the item: neither file
        assert other.get("/media/thumbnails/1.png").status_code == 404
        assert other.get("/media/thumbnails/3.png").status_code == 404
    with login(media_app, "reviewer0") as reviewer:  # a reviewer sees every queued item
        assert reviewer.get("/media/thumbnails/3.png").content == b"matched original"
    assert httpx.get(media_app + "/media/thumbnails/1.png").status_code == 303  # signed in first


@pytest.mark.parametrize(
    "path",
    [
        "thumbnails/2.png",  # a file in landing, but no task shows it
        "users/date=2026-01-01/part.parquet",
        "abuse_reports/date=2026-01-01/part.parquet",
        "chat_messages/date=2026-01-01/part.parquet",
        "thumbnails/../chat_messages/date=2026-01-01/part.parquet",
        "thumbnails/%2e%2e/chat_messages/date=2026-01-01/part.parquet",
        "thumbnails/%252e%252e/%252e%252e/secret.txt",
        "thumbnails/..%2f..%2fsecret.txt",
        "%2e%2e/secret.txt",
        "..%5csecret.txt",
        "thumbnails/1.png/../../secret.txt",
        "%2fetc%2fpasswd",
        "thumbnails/1.png%00.txt",
    ],
)
def test_media_never_serves_other_landing_files(media_app, path):
    with login(media_app, "reviewer0") as client:  # who may see every queued item
        response = client.get(f"/media/{path}")
    assert response.status_code == 404, (path, response.status_code)
    assert response.content not in (b"users", b"reports", b"chat", b"outside", b"not queued")


def answer_all(client, task: str, label: str) -> None:
    item = client.get(f"/api/tasks/{task}/next").json()["item"]
    while item is not None:
        item = client.post(f"/api/tasks/{task}/answers", json={"item_id": item["item_id"], "label": label}).json()[
            "item"
        ]


def test_verdicts_only_on_open_disputes(database_url):
    engine = connect(database_url)
    make_accounts(engine, 2)
    task = add_task(engine, TASK, ["agreed", "split", "open"], gold={"g": "violation"})
    ids = {s.key: s.item_id for s in review.item_states(engine, task)}
    with serve_app(database_url) as base_url:
        for person, label in (("annotator0", "ok"), ("annotator1", "violation")):
            with login(base_url, person) as client:
                item = client.get("/api/tasks/violation/next").json()["item"]
                while item is not None and item["key"] != "open":
                    answer = "ok" if item["key"] == "agreed" else label
                    body = {"item_id": item["item_id"], "label": answer}
                    item = client.post("/api/tasks/violation/answers", json=body).json()["item"]
        with login(base_url, "reviewer0") as reviewer:

            def verdict(key: str):
                return reviewer.post("/api/tasks/violation/verdicts", json={"item_id": ids[key], "label": "ok"})

            refused = {key: verdict(key) for key in ("gold-g", "open", "agreed")}
            assert refused["gold-g"].status_code == 409 and "gold question" in refused["gold-g"].json()["detail"]
            assert refused["open"].status_code == 409 and "0 of 2 answers" in refused["open"].json()["detail"]
            assert refused["agreed"].status_code == 409 and "answers agree" in refused["agreed"].json()["detail"]
            assert verdict("split").status_code == 200
            again = verdict("split")
            assert again.status_code == 409 and "already has a verdict" in again.json()["detail"]
    states = {s.key: s for s in review.item_states(engine, task)}
    assert states["gold-g"].gold_label == "violation"  # the key that scores everyone is untouched
    assert states["open"].verdict is None and states["agreed"].verdict is None


def test_a_verdict_longer_than_the_column_is_a_4xx_naming_the_limit(database_url):
    engine = connect(database_url)
    make_accounts(engine, 2)
    spec = TaskSpec(name="describe", question="Describe it", labels=None, annotators_per_item=2, gold_share=0)
    task = add_task(engine, spec, ["1"])
    (item_id,) = [s.item_id for s in review.item_states(engine, task)]
    with serve_app(database_url) as base_url:
        for person, text in (("annotator0", "a red teapot"), ("annotator1", "a blue teapot")):
            with login(base_url, person) as client:
                answer_all(client, "describe", text)
        with login(base_url, "reviewer0") as reviewer:
            long = reviewer.post("/api/tasks/describe/verdicts", json={"item_id": item_id, "label": "x" * 65})
    assert long.status_code == 422 and "at most 64 characters" in long.json()["detail"], long.text


@pytest.mark.parametrize("path", ["/review/violation", "/review/no_such_task", "/label/no_such_task"])
def test_pages_answer_anonymous_callers_alike_whether_or_not_the_task_exists(media_app, path):
    response = httpx.get(media_app + path)  # the sign-in page, to return to the path the caller named
    assert (response.status_code, response.headers.get("location")) == (303, login_url(path))
    with login(media_app, "annotator0") as client:
        assert client.get("/review/no_such_task").status_code == client.get("/review/violation").status_code == 403
