"""The pusher's rules on the production online store (a real Redis), with window results written
as Flink's sink commits them: newest window wins, an entity missing from the newest window gets
the empty values once, a result of that window committed later still replaces them, and a
replayed older window changes nothing."""

from __future__ import annotations

import json
import uuid

import pytest

from engines.feature_store import FeatureStoreEngine, FeatureStoreSettings
from engines.streaming import OnlinePusher
from feature_defs import catalogue
from feature_defs.compile.flink import SourceOptions, flink_job
from feature_defs.compile.streaming import streaming_plans
from tests.services import REDIS

W1, W2 = "2026-01-02 10:00:00", "2026-01-02 10:15:00"


@pytest.fixture()
def redis_store(tmp_path):
    engine = FeatureStoreEngine(FeatureStoreSettings(
        repo_dir=tmp_path / "repo", offline_root=tmp_path / "offline", project=f"mlplane_push_{uuid.uuid4().hex[:8]}",
        online_store="redis", redis_url=REDIS))
    engine.apply()
    yield engine
    engine.store.teardown()  # removes this project's keys from Redis


def trending(item: int, end: str, impressions: int, clicks: int) -> dict:
    return {"item_id": item, "window_end": end, "impressions_1h": impressions, "clicks_1h": clicks, "plays_1h": 1,
            "ctr_1h": clicks / impressions}


def test_newest_window_wins_and_silent_entities_get_empty_values_once(redis_store, tmp_path):
    spec = flink_job("j", streaming_plans(catalogue), SourceOptions(path="/unused"), str(tmp_path / "sink"))
    sink = tmp_path / "sink" / "item_trending"
    sink.mkdir(parents=True)
    commits = iter(range(1, 100))

    def commit(*rows):
        (sink / f"part-{next(commits)}").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def online(item: int) -> dict:
        values = redis_store.online_features("search", [{"item_id": item}])
        return {f: values[f"item_trending__{f}"][0] for f in ("impressions_1h", "clicks_1h", "ctr_1h")}

    pusher = OnlinePusher(redis_store.store, spec)
    try:
        commit(trending(1, W1, 10, 2), trending(2, W1, 4, 1))
        assert pusher.poll() == {"item_trending": 2}
        assert online(2) == {"impressions_1h": 4, "clicks_1h": 1, "ctr_1h": 0.25}

        commit(trending(1, W2, 8, 4))  # item 2 had no events in the window ending at W2
        assert pusher.poll() == {"item_trending": 2}  # item 1's result, item 2's empty values
        assert online(1) == {"impressions_1h": 8, "clicks_1h": 4, "ctr_1h": 0.5}
        assert online(2) == {"impressions_1h": 0, "clicks_1h": 0, "ctr_1h": None}
        commit(trending(1, W2, 8, 4))  # the same window again, as after a restart: no second emptying
        assert pusher.poll() == {"item_trending": 1}

        commit(trending(2, W2, 5, 5))  # item 2's result for W2 in a later commit (a parallel subtask)
        pusher.poll()
        assert online(2) == {"impressions_1h": 5, "clicks_1h": 5, "ctr_1h": 1.0}

        commit(trending(1, W1, 99, 99))  # a replayed older window
        pusher.poll()
        assert online(1) == {"impressions_1h": 8, "clicks_1h": 4, "ctr_1h": 0.5}
    finally:
        pusher.close()
