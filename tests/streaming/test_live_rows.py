"""Live rows of every aggregation kind against the polars plan, on a small job of its own: counts and
last_n go through our LiveWindowFunction (jobs/flink/connectors), the other kinds through Flink's
OVER aggregation. The events are made to be hard: 10-minute windows that empty and refill, events
out of order by up to 40 s (within the watermark's delay), two events of one entity in one
millisecond, values that repeat, null values, and a crash half-way (the rest from the checkpoint)."""

from __future__ import annotations

import json
import os
import random
import signal
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from engines.streaming import FlinkJob, SourceOptions, StreamingJobSettings
from engines.streaming.job import SHORT_LIVED_JVM_OPTIONS
from feature_defs.compile.flink_live import LIVE_FUNCTION, LIVE_SUFFIX
from feature_defs.compile.polars import TIMESTAMP, build_rows_at
from feature_defs.dsl import (
    Catalogue,
    Feature,
    FeatureView,
    count,
    distinct_count,
    last_n,
    max_,
    mean,
    ratio,
    sum_,
)
from feature_defs.entities import item, user
from feature_defs.expr import col
from feature_defs.sources import interactions
from simulator.files import write_bytes
from tests.streaming.conftest import TIMEOUT, normalised, sink_frame, wait_for_records, wait_until

click, play = col("event_type") == "click", col("event_type") == "play"
VIEWS = (
    FeatureView(  # LiveWindowFunction: counts and a numeric last_n
        "live_test_users",
        [user],
        interactions,
        streaming=True,
        features=[
            Feature("events_10m", count("10m")),
            Feature("clicks_10m", count("10m", where=click)),
            Feature("click_share_10m", ratio("clicks_10m", "events_10m")),
            Feature("last_played_10m", last_n("item_id", 3, "10m", where=play)),
        ],
    ),
    FeatureView(  # LiveWindowFunction: a last_n of text
        "live_test_items",
        [item],
        interactions,
        streaming=True,
        features=[Feature("plays_10m", count("10m", where=play)), Feature("devices_10m", last_n("device", 2, "10m"))],
    ),
    FeatureView(  # Flink's OVER aggregation, for its counts and last_n too (a view is computed one way)
        "live_test_other_kinds",
        [user],
        interactions,
        streaming=True,
        features=[
            Feature("purchases_10m", count("10m", where=col("event_type") == "purchase")),
            Feature("last_devices_10m", last_n("device", 2, "10m")),
            Feature("spend_10m", sum_("amount", "10m")),
            Feature("mean_play_10m", mean("play_seconds", "10m", where=play)),
            Feature("max_amount_10m", max_("amount", "10m")),
            Feature("items_10m", distinct_count("item_id", "10m")),
        ],
    ),
)
DELAY = 60  # seconds of watermark delay; events arrive out of order by up to 40 s


def hard_events(seed: int = 7, files: int = 12) -> list[list[dict]]:
    """Files of events over 50 minutes, each up to 40 s earlier than its place in the stream; some
    events of one user share a millisecond."""
    rng = random.Random(seed)
    start = datetime(2026, 3, 1, 10, tzinfo=UTC)
    events = []
    for k in range(1500):
        at = start + timedelta(seconds=k * 2 + rng.uniform(-40, 0), microseconds=rng.randrange(1000) * 1000)
        kind = rng.choice(["impression", "impression", "click", "play", "purchase"])
        events.append(
            {
                "event_id": f"e{k}",
                "event_timestamp": at,
                # a few busy users, and rare ones whose windows empty out (their state is cleared)
                "user_id": rng.randrange(6) if rng.random() < 0.6 else 100 + rng.randrange(40),
                "item_id": rng.randrange(5),
                "event_type": kind,
                "session_id": "s",
                "device": rng.choice(["ios", "android", "web"]),
                "play_seconds": round(rng.uniform(1, 300), 3) if kind == "play" else None,
                "amount": round(rng.uniform(1, 50), 2) if kind == "purchase" else None,
            }
        )
        if k % 50 == 0:  # a second event of the same user in the same millisecond
            events.append({**events[-1], "event_id": f"e{k}-twin", "item_id": (events[-1]["item_id"] + 1) % 5})
    size = -(-len(events) // files)  # in the order made: times out of order by up to 40 s
    return [events[i : i + size] for i in range(0, len(events), size)]


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("live_rows")
    events_dir = root / "events"
    events_dir.mkdir()
    job = FlinkJob(
        StreamingJobSettings(
            "interactions",
            root / "job",
            SourceOptions(path=str(events_dir), monitor_seconds=0.2),
            slide_seconds=300,
            watermark_delay_seconds=DELAY,
            checkpoint_interval_ms=500,
            live_rows=True,
            jvm_options=SHORT_LIVED_JVM_OPTIONS,  # a run of a minute or two: it starts sooner
        ),
        catalogue=Catalogue(entities=(user, item), sources=(interactions,), views=VIEWS, services=()),
    )
    files = hard_events()

    def land(first: int, last: int) -> None:
        for n in range(first, last):
            lines = [json.dumps({**e, "event_timestamp": e["event_timestamp"].isoformat()}) for e in files[n]]
            # whole, as a producer must: a file the source finds half-written loses the rest of its lines
            write_bytes(events_dir / f"events-{n:09d}.jsonl", "".join(line + "\n" for line in lines).encode())
        total = sum(map(len, files[:last]))
        wait_for_records(job, total, "every event to be read and checkpointed")

    try:
        job.start()
        job.wait_running(TIMEOUT)
        # a file still being written under its hidden name: never read (the counts would exceed the total)
        (events_dir / ".events-999999999.jsonl.tmp").write_text('{"event_id": "in-progress"}\n' * 5)
        land(0, len(files) // 2)
        os.killpg(job.status()["pid"], signal.SIGKILL)  # a crash: the rest from its newest checkpoint
        wait_until(lambda: job.health().status == "DIED", "the kill to be noticed")
        job.restart()
        job.wait_running(TIMEOUT)
        land(len(files) // 2, len(files))
        health = job.health()
        yield job, pl.DataFrame([e for chunk in files for e in chunk]), health
    finally:
        job.stop()


def test_the_live_function_computes_counts_and_last_n(live_run):
    job, _, _ = live_run
    spec = job.spec()
    live_inserts = {v: " ".join(i for i in spec.inserts if f"{v}{LIVE_SUFFIX}`" in i) for v in spec.views}
    function_views = {v: LIVE_FUNCTION in insert for v, insert in live_inserts.items()}
    assert function_views == {"live_test_users": True, "live_test_items": True, "live_test_other_kinds": False}


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.name)
def test_live_rows_equal_the_polars_plan(live_run, view):
    job, events, health = live_run
    assert health.late == 0 and health.malformed == 0  # the disorder stays within the delay
    keys = view.join_keys
    wait_until(lambda: (job.sink_root / f"{view.name}{LIVE_SUFFIX}").exists(), "live rows")
    # the rows of the events the watermark has passed (it trails the newest event by the delay)
    passed = events["event_timestamp"].max() - timedelta(seconds=DELAY + 1)
    at = (pl.col("event_timestamp").dt.truncate("1ms") + pl.duration(milliseconds=1)).alias("window_end")
    expected = events.select([*(pl.col(k) for k in keys), at]).unique().filter(pl.col("window_end") <= passed)

    def rows_passed():
        rows = sink_frame(job.sink_root / f"{view.name}{LIVE_SUFFIX}").filter(pl.col("window_end") <= passed)
        return rows.height >= expected.height and [rows]

    try:  # a checkpoint or two after the last event is read
        (got,) = wait_until(rows_passed, "the live rows of every event the watermark passed", timeout=30)
    except AssertionError:  # rows are missing: show which
        got = sink_frame(job.sink_root / f"{view.name}{LIVE_SUFFIX}").filter(pl.col("window_end") <= passed)
    # events of an entity in one millisecond share their values (an OVER aggregation writes them once each)
    got = got.unique()
    assert (
        got.select([*keys, "window_end"]).sort([*keys, "window_end"]).to_dicts()
        == expected.sort([*keys, "window_end"]).to_dicts()
    )  # one row per entity and millisecond with events: none lost, none doubled
    lists = {f.name for f in view.features if view.dtype_of(f).endswith("_list")}
    for row in random.Random(3).sample(got.rows(named=True), 150):
        want = build_rows_at(view, events.lazy(), row["window_end"]).collect()
        want = want.filter(pl.all_horizontal([pl.col(k) == row[k] for k in keys])).drop(TIMESTAMP)
        for feature in view.feature_names:
            is_list = feature in lists
            assert normalised([row[feature]], is_list) == normalised(want[feature], is_list), (
                f"{view.name}.{feature} at {row['window_end']} for {[row[k] for k in keys]}"
            )
