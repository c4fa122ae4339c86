"""The labeling app against hostile callers: media only for items in a task (no other landing folder,
no path traversal), verdicts only on open disputes, authorization before existence, field limits."""

from __future__ import annotations

import httpx
import pytest

from ground_truth import queue
from ground_truth.db import connect
from ground_truth.schema import ItemIn, TaskSpec
from tests.ground_truth.conftest import login, make_accounts, serve_app

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
    make_accounts(engine, 1)
    task = queue.create_task(engine, TASK)
    queue.add_items(engine, task, [ItemIn(key="1", queue="audit", thumbnail="thumbnails/1.png")])
    with serve_app(url, landing) as base_url:
        yield base_url


def test_media_serves_the_thumbnails_of_queued_items(media_app):
    with login(media_app, "annotator0") as client:
        assert client.get("/media/thumbnails/1.png").content == b"queued"
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
    with login(media_app, "annotator0") as client:
        response = client.get(f"/media/{path}")
    assert response.status_code == 404, (path, response.status_code)
    assert response.content not in (b"users", b"reports", b"chat", b"outside", b"not queued")
