"""Feast's feature-server API on the model server: the same request answered by `feast serve` (started
once on the same repository and online store) and by the model server gives the same JSON."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.serving.models.conftest import free_port


@pytest.fixture(scope="module")
def feast_serve(platform_server):
    repo = platform_server.server.feature_store.write_repo().parent
    port = free_port()
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("feast")),
            "-c",
            str(repo),
            "serve",
            "-p",
            str(port),
            "--no-access-log",
            "-w",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "FEAST_USAGE": "False"},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        assert process.poll() is None and time.time() < deadline, "feast serve did not start"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.5)
    yield url
    os.killpg(process.pid, 15)
    process.wait(60)


def by_feature(answer: dict) -> dict:
    """Feature name -> its result. The order of a view's features in Feast's answer differed between
    `feast serve` and this process reading the same registry (seen here), so names are matched."""
    names = answer["metadata"]["feature_names"]
    assert len(names) == len(answer["results"])
    return dict(zip(names, answer["results"]))


def test_get_online_features_answers_as_feast_serve_does(platform_server, feast_serve):
    requests = [
        {
            "feature_service": "personalization_ranking",
            "full_feature_names": True,
            "entities": {"user_id": [1, 2, 3, 999999], "item_id": [5, 6, 7, 8]},
        },
        {
            "features": ["user_engagement:clicks_7d", "user_profile:region", "user_activity_realtime:plays_1h"],
            "entities": {"user_id": [4, 5]},
        },
        {"feature_service": "search", "entities": {"item_id": [1, 2, 3]}},
    ]
    for body in requests:
        theirs = httpx.post(f"{feast_serve}/get-online-features", json=body, timeout=30)
        ours = httpx.post(f"{platform_server.url}/get-online-features", json=body, timeout=30)
        assert theirs.status_code == ours.status_code == 200, (theirs.text, ours.text)
        assert set(ours.json()) == set(theirs.json()) == {"metadata", "results"}
        assert by_feature(ours.json()) == by_feature(theirs.json())
    assert any(s == "PRESENT" for r in ours.json()["results"] for s in r["statuses"])


def test_get_online_features_rejects_bad_requests_with_4xx(platform_server):
    url = f"{platform_server.url}/get-online-features"
    cases = [
        ({"feature_service": "nope", "entities": {"user_id": [1]}}, 404, "unknown feature service 'nope'"),
        ({"entities": {"user_id": [1]}}, 400, "give a feature_service"),
        ({"feature_service": "search", "entities": {"item_id": [1, 2], "user_id": [1]}}, 400, "differ in length"),
        ({"feature_service": "search", "entities": {}}, 400, "entities is empty"),
        ({"feature_service": "search", "entities": {"item_id": [1.5]}}, 400, "integers or strings"),
        ({"feature_service": "search"}, 400, "entities"),
        ({"features": ["no_such_view:x"], "entities": {"user_id": [1]}}, 400, ""),
    ]
    for body, status, message in cases:
        response = httpx.post(url, json=body, timeout=30)
        assert response.status_code == status and message in response.json()["error"], (body, response.text)
