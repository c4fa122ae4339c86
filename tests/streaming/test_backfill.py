"""Backfill: the streaming views' compiled SQL in Flink batch mode over the pipeline's historical
landing partitions gives, at each day's end, exactly the rows of the polars batch plan's
offline tables (tumbling windows here: slide == window)."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from engines.lake import Lake
from engines.streaming import WINDOW_END, SourceOptions, StreamingJobSettings, backfill, read_committed_rows
from feature_defs import catalogue
from feature_defs.compile.polars import TIMESTAMP, day_end
from tests.conftest import DAYS, FIRST_DAY
from tests.streaming.conftest import normalised

DAYS_RANGE = [FIRST_DAY + timedelta(days=k) for k in range(DAYS)]
STREAMING_VIEWS = [v for v in catalogue.views if v.streaming]


@pytest.fixture(scope="module")
def backfilled(pipeline_dir, tmp_path_factory):
    settings = StreamingJobSettings("interactions", tmp_path_factory.mktemp("backfill"), SourceOptions(),
                                    slide_seconds=3600)
    job, counts = backfill(settings, Lake(pipeline_dir), DAYS_RANGE)
    return job, counts


def test_backfill_counts_every_landing_line(pipeline_dir, backfilled):
    _, counts = backfilled
    lake = Lake(pipeline_dir)
    landed = pl.concat([pl.read_parquet(p) for d in DAYS_RANGE for p in lake.landing_files("interactions", d)])
    assert counts["lines_staged"] == counts["records"] == landed.height
    assert counts["malformed"] == 0 and counts["late"] == 0


@pytest.mark.parametrize("view", STREAMING_VIEWS, ids=lambda v: v.name)
def test_backfill_equals_the_polars_offline_tables_at_each_day_end(pipeline_dir, backfilled, view):
    job, _ = backfilled
    lake = Lake(pipeline_dir)
    rows = pl.DataFrame(read_committed_rows(job.sink_root / view.name), infer_schema_length=None)
    keys = view.join_keys
    for day in DAYS_RANGE:
        end = day_end(day)
        got = rows.filter(pl.col(WINDOW_END) == end.strftime("%Y-%m-%d %H:%M:%S")).drop(WINDOW_END).sort(keys)
        offline = lake.read_partition("offline", view.name, day).drop(TIMESTAMP)
        # offline rows cover every entity of the lookback (zeros); Flink emits entities active in the window
        assert got.height > 0
        want = offline.join(got.select(keys), on=keys).sort(keys)
        assert got[keys].to_dicts() == want[keys].to_dicts()
        silent = offline.join(got.select(keys), on=keys, how="anti")
        counts = [f.name for f in view.features if f.name.endswith("_1h") and not f.name.startswith(("ctr", "last"))]
        assert silent.select(pl.sum_horizontal(counts).sum()).item() == 0  # nobody active was missed
        lists = {f.name for f in view.features if view.dtype_of(f).endswith("_list")}
        for feature in view.feature_names:
            is_list = feature in lists
            assert normalised(got[feature], is_list) == normalised(want[feature], is_list), (
                f"{view.name}.{feature} on {day}")
