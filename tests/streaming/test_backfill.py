"""Backfill: the streaming views' compiled SQL in Flink batch mode over the pipeline's historical
landing partitions (tumbling windows here: slide == window) equals the polars batch plan window
by window, and agrees with the offline tables the daily pipeline wrote at each day's end."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from engines.lake import Lake
from engines.streaming import SourceOptions, StreamingJobSettings, backfill
from feature_defs import catalogue
from feature_defs.compile.polars import TIMESTAMP, day_end
from tests.conftest import DAYS, FIRST_DAY
from tests.streaming.conftest import WINDOW_END, assert_windows_equal_polars, sink_frame

DAYS_RANGE = [FIRST_DAY + timedelta(days=k) for k in range(DAYS)]
STREAMING_VIEWS = [v for v in catalogue.views if v.streaming]


@pytest.fixture(scope="module")
def backfilled(pipeline_dir, tmp_path_factory):
    settings = StreamingJobSettings("interactions", tmp_path_factory.mktemp("backfill"), SourceOptions(),
                                    slide_seconds=3600)
    return backfill(settings, Lake(pipeline_dir), DAYS_RANGE)


@pytest.fixture(scope="module")
def landed(pipeline_dir) -> pl.DataFrame:
    lake = Lake(pipeline_dir)
    return pl.concat([pl.read_parquet(p) for d in DAYS_RANGE for p in lake.landing_files("interactions", d)])


def test_backfill_counts_every_landing_line(backfilled, landed):
    _, counts = backfilled
    assert counts["lines_staged"] == counts["records"] == landed.height
    assert counts["malformed"] == 0 and counts["late"] == 0


@pytest.mark.parametrize("view", STREAMING_VIEWS, ids=lambda v: v.name)
def test_backfill_equals_the_polars_plan_window_by_window(pipeline_dir, backfilled, landed, view):
    job, _ = backfilled
    sink = sink_frame(job.sink_root / view.name)
    assert sink[WINDOW_END].n_unique() > 20 * DAYS  # hourly windows across the days
    assert assert_windows_equal_polars(sink, landed, view) > 1000
    # at each day's end the daily pipeline's offline rows say the same: whoever is missing from
    # Flink's output had no events in the window, so the offline counts are zero
    lake = Lake(pipeline_dir)
    counts = [f.name for f in view.features if view.dtype_of(f) == "int64"]
    for day in DAYS_RANGE:
        offline = lake.read_partition("offline", view.name, day).drop(TIMESTAMP)
        emitted = sink.filter(pl.col(WINDOW_END) == day_end(day)).select(view.join_keys)
        silent = offline.join(emitted, on=view.join_keys, how="anti")
        assert silent.height > 0 and silent.select(pl.sum_horizontal(counts).sum()).item() == 0
