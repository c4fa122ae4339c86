"""The pusher's rules on the production online store (a real Redis) and the local one (SQLite,
which the pusher writes directly, not through Feast), with window results written
as Flink's sink commits them: newest window wins, an entity missing from the newest window gets
the empty values once, a result of that window committed later still replaces them, and a
replayed older window changes nothing; old applied files are pruned, the job's counts kept."""

from __future__ import annotations

import json
import os
import random
import time
import uuid

import pytest

from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings
from engines.streaming import TOTALS_FILE, OnlinePusher, fold_metrics, job_metrics
from engines.streaming.sink import read_rows
from feature_defs import catalogue
from feature_defs.compile.flink import SourceOptions, flink_job
from feature_defs.compile.streaming import streaming_plans
from tests.services import REDIS

W1, W2 = "2026-01-02 10:00:00", "2026-01-02 10:15:00"


@pytest.fixture(params=["redis", "sqlite"])
def online_store(tmp_path, request):
    engine = FeatureStoreEngine(
        FeatureStoreSettings(
            repo_dir=tmp_path / "repo",
            offline_root=tmp_path / "offline",
            project=f"mlplane_push_{uuid.uuid4().hex[:8]}",
            online_store=request.param,
            redis_url=REDIS,
        )
    )
    engine.apply()
    yield engine
    engine.store.teardown()  # removes this project's keys from Redis


def trending(item: int, end: str, impressions: int, clicks: int) -> dict:
    return {
        "item_id": item,
        "window_end": end,
        "impressions_1h": impressions,
        "clicks_1h": clicks,
        "plays_1h": 1,
        "ctr_1h": clicks / impressions,
    }


def test_newest_window_wins_and_silent_entities_get_empty_values_once(online_store, tmp_path):
    spec = flink_job("j", streaming_plans(catalogue), SourceOptions(path="/unused"), str(tmp_path / "sink"))
    sink = tmp_path / "sink" / "item_trending"
    sink.mkdir(parents=True)
    commits = iter(range(1, 100))

    def commit(*rows):
        (sink / f"part-{next(commits)}").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def online(item: int) -> dict:
        values = online_store.online_features("search", [{"item_id": item}])
        return {f: values[f"item_trending__{f}"][0] for f in ("impressions_1h", "clicks_1h", "ctr_1h")}

    pusher = OnlinePusher(online_store.store, spec)
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


def test_old_applied_files_are_pruned_and_the_job_counts_survive(online_store, tmp_path):
    """A job running for weeks commits a file per checkpoint and subtask: the pusher deletes applied
    result files older than `keep_seconds` and folds old metric files into the job's totals."""
    spec = flink_job("j", streaming_plans(catalogue), SourceOptions(path="/unused"), str(tmp_path / "sink"))
    sink, metrics = tmp_path / "sink" / "item_trending", tmp_path / "sink" / "_metrics"
    sink.mkdir(parents=True)
    metrics.mkdir()
    (sink / "part-1").write_text(json.dumps(trending(1, W1, 10, 2)) + "\n")
    (sink / "part-2").write_text(json.dumps(trending(1, W2, 8, 4)) + "\n")
    (metrics / "part-1").write_text(
        json.dumps({"records": 10, "malformed": 1, "late": 2, "max_event_time": "2026-01-02 10:05:00"}) + "\n"
    )
    (metrics / "part-2").write_text(
        json.dumps({"records": 5, "malformed": 0, "late": 1, "max_event_time": "2026-01-02 10:20:00"}) + "\n"
    )
    counts = {"records": 15, "malformed": 1, "late": 3, "newest_event_time": "2026-01-02 10:20:00"}
    hour_ago = time.time() - 3600
    for old in (sink / "part-1", metrics / "part-1"):
        os.utime(old, (hour_ago, hour_ago))

    with pytest.raises(ValueError, match="keep_seconds and live_keep_seconds must be at least 60"):
        OnlinePusher(online_store.store, spec, keep_seconds=5)
    pusher = OnlinePusher(online_store.store, spec, keep_seconds=60)
    try:
        pusher.poll()
        (sink / "part-4").write_text(json.dumps(trending(2, W2, 3, 3)) + "\n")
        os.utime(sink / "part-4", (hour_ago, hour_ago))
        assert pusher.prune() == 2  # result part-1 and metric part-1; part-2 is recent, part-4 not applied yet
        assert sorted(p.name for p in sink.iterdir()) == ["part-2", "part-4"]
        assert sorted(p.name for p in metrics.iterdir()) == [TOTALS_FILE, "part-2"]
        assert job_metrics(metrics) == counts
        assert pusher.poll() == {"item_trending": 1}  # only part-4: nothing pruned is applied again
        values = online_store.online_features("search", [{"item_id": 1}])
        assert values["item_trending__clicks_1h"] == [4]
    finally:
        pusher.close()

    # a fold cut short after writing the totals: the file it took in is not counted twice, then deleted
    (metrics / "part-5").write_text(json.dumps({"records": 7, "malformed": 0, "late": 0}) + "\n")
    folded = json.loads((metrics / TOTALS_FILE).read_text())
    folded["totals"]["records"] += 7
    (metrics / TOTALS_FILE).write_text(json.dumps({"totals": folded["totals"], "folded": ["part-5"]}))
    assert job_metrics(metrics)["records"] == 22
    assert fold_metrics(metrics, older_than=0) == 0
    assert not (metrics / "part-5").exists() and job_metrics(metrics)["records"] == 22


def test_live_rows_take_over_between_window_ends_and_never_empty_anyone(online_store, tmp_path):
    """A live row (an event's value, stamped a millisecond after it) is newer than the window end
    before it and older than the one after; only window ends say who had no events."""
    spec = flink_job(
        "j", streaming_plans(catalogue), SourceOptions(path="/unused"), str(tmp_path / "sink"), live_rows=True
    )
    assert spec.views["item_trending"].live == str(tmp_path / "sink" / "item_trending__live")
    windows, live = tmp_path / "sink" / "item_trending", tmp_path / "sink" / "item_trending__live"
    windows.mkdir(parents=True)
    live.mkdir()
    commits = iter(range(1, 100))

    def commit(folder, *rows):
        (folder / f"part-{next(commits)}").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def online(item: int) -> tuple:
        values = online_store.online_features("search", [{"item_id": item}])
        return values["item_trending__impressions_1h"][0], values["item_trending__clicks_1h"][0]

    pusher = OnlinePusher(online_store.store, spec)
    try:
        commit(windows, trending(1, W1, 10, 2), trending(2, W1, 4, 1))
        commit(live, trending(1, "2026-01-02 10:03:00.001", 11, 3))
        assert pusher.poll() == {"item_trending": 2}  # item 1's live row is newer than W1
        assert online(1) == (11, 3) and online(2) == (4, 1)  # a live row empties no one

        commit(live, trending(1, "2026-01-02 10:07:30.25", 12, 3), trending(1, "2026-01-02 10:07:30.5", 13, 4))
        pusher.poll()
        assert online(1) == (13, 4)  # the newer of two in one commit (fractions compare as times)

        commit(windows, trending(1, W2, 9, 4))  # W2 after both live rows; item 2 had no events before it
        pusher.poll()
        assert online(1) == (9, 4) and online(2) == (0, 0)
        commit(live, trending(1, "2026-01-02 10:07:30.5", 13, 4))  # replayed after a restart: older than W2
        pusher.poll()
        assert online(1) == (9, 4)

        # applied live files go after a minute, window ends after keep_seconds (an hour)
        for path in [*windows.iterdir(), *live.iterdir()]:
            os.utime(path, (time.time() - 120,) * 2)
        assert pusher.prune() == 3 and list(live.iterdir()) == [] and len(list(windows.iterdir())) == 2
    finally:
        pusher.close()


def test_sink_rows_are_read_as_the_json_module_reads_them(tmp_path):
    """read_rows parses with orjson and falls back to the json module for what orjson refuses: the
    rows must be the json module's, whatever the line holds."""
    rng = random.Random(5)
    rows = [
        {
            "user_id": rng.randint(-(2**63), 2**63 - 1),
            "window_end": f"2026-01-05 10:{rng.randint(0, 59):02d}:00.{rng.randint(0, 999):03d}",
            "mean": rng.choice([None, rng.uniform(-1e300, 1e300), rng.random()]),
            "items": rng.sample(range(10**6), rng.randint(0, 5)),
            "name": rng.choice(["", "ünïcödé ✓", 'quote " and \\ slash']),
        }
        for _ in range(300)
    ]
    lines = [json.dumps(row) for row in rows]
    lines += ['{"mean": NaN, "user_id": 1}', '{"x": -Infinity}', '{"user_id": 123456789012345678901234567890}']
    lines += [json.dumps({"user_id": n}) for n in (-(2**63) - 1, 2**64 - 1, 2**64, -(2**63))]
    path = tmp_path / "part-0"
    path.write_text("\n".join(lines) + "\n\n")
    got = read_rows(path)
    want = [json.loads(line) for line in lines]
    assert json.dumps(got) == json.dumps(want)  # NaN compares unequal to itself: compare the texts
    assert [type(v) for row in got for v in row.values()] == [type(v) for row in want for v in row.values()]
