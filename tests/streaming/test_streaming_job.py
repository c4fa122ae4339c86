"""The streaming job end to end on a real Flink mini-cluster and a real Feast online store (see
conftest.py for the run): values equal the polars batch plan window by window, and each live row
the plan just after its event, through a crash and a restart from the checkpoint; late and
malformed lines are counted, never fatal; online reads serve streaming and batch features side by
side."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, time, timedelta

import polars as pl
import pytest

from engines.streaming import WINDOW_END, read_committed_rows
from feature_defs import catalogue
from feature_defs.compile.flink import LIVE_SUFFIX
from feature_defs.compile.polars import TIMESTAMP, build_rows_at, day_end
from feature_defs.dsl import Aggregation
from tests.streaming.conftest import (
    STREAM_DAY,
    WATERMARK_DELAY,
    assert_windows_equal_polars,
    normalised,
    sink_frame,
)

STREAMING_VIEWS = [v for v in catalogue.views if v.streaming]
LIVE_VIEWS = [  # views over a trailing window; running totals have window-end rows only
    v for v in STREAMING_VIEWS if not any(isinstance(f.spec, Aggregation) and f.spec.running for f in v.features)
]


@pytest.mark.parametrize("view", STREAMING_VIEWS, ids=lambda v: v.name)
def test_every_window_equals_the_polars_plan_through_a_crash_and_restart(streaming_run, view):
    sink = sink_frame(streaming_run.job.sink_root / view.name)
    ends = sorted(sink[WINDOW_END].unique())
    assert ends[0] <= datetime.combine(STREAM_DAY, time(1), tzinfo=UTC)
    assert ends[-1] >= day_end(STREAM_DAY)  # windows on both sides of the crash at noon, and past midnight
    # duplicates would show a re-emitted window; counts off would show events read twice or lost
    assert assert_windows_equal_polars(sink, pl.from_arrow(streaming_run.streamed), view) > 1000


@pytest.mark.parametrize("view", LIVE_VIEWS, ids=lambda v: v.name)
def test_each_event_gets_one_live_row_equal_to_the_polars_plan_just_after_it(streaming_run, view):
    """A live row per entity and millisecond with events, none lost or doubled across the crash,
    each the plan's value at that millisecond + 1 ms (its window_end), checked at random events."""
    keys = view.join_keys
    events = pl.from_arrow(streaming_run.streamed)
    live = sink_frame(streaming_run.job.sink_root / f"{view.name}{LIVE_SUFFIX}")
    # events the watermark has passed (it trails the newest event by the delay): those have rows
    passed = events["event_timestamp"].max() - timedelta(seconds=WATERMARK_DELAY + 1)
    at = (pl.col("event_timestamp").dt.truncate("1ms") + pl.duration(milliseconds=1)).alias(WINDOW_END)
    expected = (
        events.filter(pl.col("event_timestamp") < passed)
        .select([*(pl.col(view.source_column(k)).alias(k) for k in keys), at])
        .unique()
    )
    got = live.filter(pl.col(WINDOW_END) <= passed).select([*keys, WINDOW_END])
    assert expected.height > 1000
    assert got.sort([*keys, WINDOW_END]).to_dicts() == expected.sort([*keys, WINDOW_END]).to_dicts()

    rng = random.Random(17)
    lists = {f.name for f in view.features if view.dtype_of(f).endswith("_list")}
    sample = live.unique([*keys, WINDOW_END]).sort([*keys, WINDOW_END]).rows(named=True)
    for row in rng.sample(sample, 60):
        want = build_rows_at(view, events.lazy(), row[WINDOW_END]).collect()
        want = want.filter(pl.all_horizontal([pl.col(k) == row[k] for k in keys])).drop(TIMESTAMP)
        assert want.height == 1, (view.name, row)
        for feature in view.feature_names:
            is_list = feature in lists
            assert normalised([row[feature]], is_list) == normalised(want[feature], is_list), (
                f"{view.name}.{feature} at {row[WINDOW_END]} for {[row[k] for k in keys]}"
            )


def test_a_killed_job_is_detected_and_resumes_from_its_checkpoint(streaming_run):
    killed = streaming_run.health_after_kill
    assert killed.status == "DIED" and not killed.healthy
    assert "gone" in killed.error
    assert streaming_run.checkpoint_restored is not None
    assert streaming_run.checkpoint_restored.name.startswith("chk-")
    assert streaming_run.job.status()["restored_from"] == str(streaming_run.checkpoint_restored)
    # every line counted exactly once across the crash: no file was read twice
    assert streaming_run.health_at_end.records == streaming_run.lines_appended
    # the state was restored from the changelog the checkpoints point into, not from full snapshots
    assert any(f.is_file() for f in (streaming_run.job.state_dir / "changelog").rglob("*"))


def test_the_restart_keeps_the_killed_runs_log_and_resumes_from_its_newest_checkpoint(streaming_run):
    job = streaming_run.job
    logs = [log.read_text(errors="replace") for log in job.log_dir.glob("flink-*.log*")]
    killed = rf"Completed checkpoint (\d+) for job {streaming_run.health_after_kill.job_id}"
    completed = [int(n) for text in logs for n in re.findall(killed, text)]
    assert completed, "the killed run's Flink log is gone"  # PyFlink's own log settings truncate it at a start
    # the newest it logged, or one it finished after its last line
    assert int(streaming_run.checkpoint_restored.name.removeprefix("chk-")) >= max(completed)
    assert any(f"for job {streaming_run.health_at_end.job_id}" in text for text in logs)


def test_late_and_malformed_events_are_counted_and_do_not_stop_the_job(streaming_run):
    health = streaming_run.health_at_end
    assert health.status == "RUNNING" and health.healthy
    assert health.malformed == streaming_run.malformed_events
    assert health.late == streaming_run.late_events
    assert health.checkpoint_age_seconds is not None and health.lag_seconds is not None


def test_online_reads_serve_streaming_and_batch_features_side_by_side(streaming_run):
    """A user's online values are those of their newest row, a window end's or a live one, or the
    empty values when the newest window held none of their events (Flink emits no empty windows;
    the pusher writes them)."""
    streaming_run.pusher.poll()  # whatever the last checkpoint committed
    sink = streaming_run.job.sink_root
    windows = read_committed_rows(sink / "user_activity_realtime")
    newest = {}
    for row in windows + read_committed_rows(sink / f"user_activity_realtime{LIVE_SUFFIX}"):
        if row["user_id"] not in newest or newest[row["user_id"]][WINDOW_END] < row[WINDOW_END]:
            newest[row["user_id"]] = row
    last = max(r[WINDOW_END] for r in windows)
    live = sorted(u for u, r in newest.items() if r[WINDOW_END] > last)[:5]
    active = live + sorted(u for u, r in newest.items() if r[WINDOW_END] == last)[: 10 - len(live)]
    gone = sorted(u for u, r in newest.items() if r[WINDOW_END] < last)[:10]
    assert live, "some users' newest row is a live one, newer than the last window end"
    assert len(active) == len(gone) == 10
    online = streaming_run.engine.online_features(
        "personalization_ranking", [{"user_id": u, "item_id": 1} for u in active + gone]
    )
    empty = {"impressions_1h": 0, "clicks_1h": 0, "plays_1h": 0, "ctr_1h": None, "last_played_items_1h": []}
    for feature, nothing in empty.items():
        want = [newest[u][feature] for u in active] + [nothing] * len(gone)
        is_list = feature.startswith("last")
        assert normalised(online[f"user_activity_realtime__{feature}"], is_list) == normalised(want, is_list), feature
    # the batch features of the same users come from the daily pipeline's materialization
    assert any(v is not None for v in online["user_engagement__impressions_7d"])
    assert any(v is not None for v in online["user_profile__country"])
