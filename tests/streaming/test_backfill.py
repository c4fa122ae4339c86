"""Backfill through Dagster: `streaming_history/*` runs the streaming views' compiled SQL in Flink
batch mode over the pipeline's landing partitions (hourly windows here), equals the polars batch
plan window by window, checks itself against the offline tables at each day's end, re-runs a day
idempotently, and writes nothing when its check fails."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta

import polars as pl
import pytest
from dagster import AssetSelection, DagsterInstance, materialize

from assets import all_assets
from assets.streaming import MATCHES_OFFLINE, history_key
from engines.data.lake import Lake
from engines.features.feature_tables import OFFLINE_ZONE
from engines.streaming import HISTORY_ZONE
from engines.streaming.backfill import SHORT_BACKFILL_LINES
from engines.streaming.job import SHORT_LIVED_JVM_OPTIONS
from feature_defs import catalogue
from feature_defs.compile.polars import TIMESTAMP
from feature_defs.dsl import Aggregation
from orchestration.profiles import resources_for
from tests.conftest import DAYS, FIRST_DAY, LAST_DAY, TEST_SLIDE_SECONDS, run_pipeline
from tests.streaming.conftest import WINDOW_END, assert_windows_equal_polars

DAYS_RANGE = [FIRST_DAY + timedelta(days=k) for k in range(DAYS)]
STREAMING_VIEWS = [v for v in catalogue.views if v.streaming]
HISTORY = AssetSelection.groups("streaming_history")


@pytest.fixture(scope="module")
def first_run(pipeline_run):
    """The backfill of the three days: the pipeline lake's run, which materialized `streaming_history`."""
    return pipeline_run


@pytest.fixture(scope="module")
def lake_dir(pipeline_dir, tmp_path_factory):
    """What the backfill reads (landing, offline tables) and what the first run wrote, copied: the tests
    run it again into the lake."""
    root = tmp_path_factory.mktemp("backfill_lake")
    for zone in ("landing", OFFLINE_ZONE, HISTORY_ZONE):
        shutil.copytree(pipeline_dir / zone, root / zone)
    return root


def history(lake_dir, view) -> pl.DataFrame:
    lake = Lake(lake_dir)
    return pl.concat([lake.read_partition(HISTORY_ZONE, view.name, d) for d in DAYS_RANGE])


def metadata(result, view) -> dict:
    """The metadata of the run's materialization (Dagster records it once per partition of the range)."""
    events = [e for e in result.get_asset_materialization_events() if e.asset_key == history_key(view.name)]
    assert sorted(e.partition for e in events) == [d.isoformat() for d in DAYS_RANGE]
    return {k: v.value for k, v in events[0].materialization.metadata.items()}


def test_one_flink_job_reads_every_landing_line(first_run, pipeline_dir):
    lake = Lake(pipeline_dir)
    landed = sum(pl.read_parquet(p).height for d in DAYS_RANGE for p in lake.landing_files("interactions", d))
    for view in STREAMING_VIEWS:
        meta = metadata(first_run, view)
        assert meta["lines_read"] == landed and meta["malformed_events"] == 0
        # a backfill this small runs without the optimizing JIT (engines.streaming.backfill)
        assert landed <= SHORT_BACKFILL_LINES and meta["flink_jvm_options"] == SHORT_LIVED_JVM_OPTIONS
        # hourly windows: a running total is emitted every hour up to its period's end, a sliding window
        # only while it holds events (the simulated days are quiet from 23:00)
        running = all(f.spec.running for f in view.features if isinstance(f.spec, Aggregation))
        assert meta["windows"] == 24 * DAYS if running else 20 * DAYS < meta["windows"] < 24 * DAYS


@pytest.mark.parametrize("view", STREAMING_VIEWS, ids=lambda v: v.name)
def test_history_equals_the_polars_plan_window_by_window(first_run, lake_dir, pipeline_dir, view):
    lake = Lake(pipeline_dir)
    landed = pl.concat([pl.read_parquet(p) for d in DAYS_RANGE for p in lake.landing_files("interactions", d)])
    rows = history(lake_dir, view)
    assert rows.schema == Lake(pipeline_dir).read_partition(OFFLINE_ZONE, view.name, FIRST_DAY).schema
    assert assert_windows_equal_polars(rows.rename({TIMESTAMP: WINDOW_END}), landed, view) > 1000
    [check] = [c for c in first_run.get_asset_check_evaluations() if c.asset_key == history_key(view.name)]
    assert check.check_name == MATCHES_OFFLINE and check.passed


def test_the_prod_profile_reruns_a_day_on_the_cluster_idempotently(
    first_run, lake_dir, flink_cluster, prod_env, monkeypatch
):
    """In the prod profile the Flink resource submits the backfill to the session cluster (the
    JobManager's REST API shows the batch job). Run again over a day the local run wrote (alone, it
    still sees the day before for the windows that start there), it rewrites the day's history and
    every view's history is as the local run left it: the cluster's result is the local one, and a
    rerun is idempotent."""
    day = DAYS_RANGE[1]
    before = {v.name: history(lake_dir, v) for v in STREAMING_VIEWS}
    lake = Lake(lake_dir)
    written = {v.name: lake.partition_path(HISTORY_ZONE, v.name, day).stat().st_mtime_ns for v in STREAMING_VIEWS}
    monkeypatch.setenv("MLPLANE_FLINK_REST_URL", flink_cluster.rest_address)
    finished_before = _finished_batch_jobs(flink_cluster)
    result = materialize(
        all_assets,
        selection=HISTORY,
        resources=resources_for("prod", data_dir=str(lake_dir)),
        instance=DagsterInstance.ephemeral(),
        partition_key=day.isoformat(),
        run_config={"ops": {"streaming_history_interactions": {"config": {"slide_seconds": TEST_SLIDE_SECONDS}}}},
    )
    assert result.success
    assert _finished_batch_jobs(flink_cluster) == finished_before + 1
    for view in STREAMING_VIEWS:
        assert lake.partition_path(HISTORY_ZONE, view.name, day).stat().st_mtime_ns != written[view.name]
        assert lake.read_partition(HISTORY_ZONE, view.name, day).height > 0
        assert history(lake_dir, view).equals(before[view.name])


def _finished_batch_jobs(cluster) -> int:
    return sum(
        1
        for job in cluster.rest.get("/jobs/overview")["jobs"]
        if job["name"] == "streaming_features_interactions" and job["jobType"] == "BATCH" and job["state"] == "FINISHED"
    )


def test_a_failed_check_writes_nothing(first_run, lake_dir):
    lake = Lake(lake_dir)
    # an offline table that disagrees (as a changed definition would) fails the check: nothing written
    view, last = catalogue.view("item_sales_today"), DAYS_RANGE[-1]
    offline = lake.read_partition(OFFLINE_ZONE, view.name, last)
    busiest = offline.sort("clicks_today", descending=True).row(0, named=True)["item_id"]
    lake.write_partition(
        OFFLINE_ZONE,
        view.name,
        last,
        offline.with_columns(
            clicks_today=pl.when(pl.col("item_id") == busiest)
            .then(pl.col("clicks_today") + 1)
            .otherwise(pl.col("clicks_today"))
        ),
    )
    written = lake.partition_path(HISTORY_ZONE, view.name, last).stat().st_mtime_ns
    failed = run_pipeline(
        lake_dir, last, last, selection=HISTORY, instance=DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not failed.success
    checks = {c.asset_key: c for c in failed.get_asset_check_evaluations()}
    assert not checks[history_key(view.name)].passed
    assert checks[history_key("item_trending")].passed
    differences = checks[history_key(view.name)].metadata["differences"].value.records
    assert [(r.data["feature"], r.data["entity"]) for r in differences] == [
        ("clicks_today", f'{{"item_id": {busiest}}}')
    ]
    assert lake.partition_path(HISTORY_ZONE, view.name, last).stat().st_mtime_ns == written


def test_a_selected_view_alone_is_computed_checked_and_written(first_run, lake_dir):
    """The demo selects the histories its training set reads: the Flink job then computes those views
    only, and the others' partitions stay as they were."""
    day, one = DAYS_RANGE[1], history_key("user_activity_realtime")
    before = {v.name: history(lake_dir, v) for v in STREAMING_VIEWS}
    written = {
        v.name: Lake(lake_dir).partition_path(HISTORY_ZONE, v.name, day).stat().st_mtime_ns for v in STREAMING_VIEWS
    }
    result = run_pipeline(lake_dir, day, day, selection=AssetSelection.assets(one))
    assert {e.asset_key for e in result.get_asset_materialization_events()} == {one}
    assert {c.asset_key for c in result.get_asset_check_evaluations()} == {one}
    spec = json.loads((lake_dir / "streaming" / "interactions" / "backfill" / f"{day}_{day}" / "spec.json").read_text())
    assert list(spec["views"]) == ["user_activity_realtime"]
    for view in STREAMING_VIEWS:
        assert history(lake_dir, view).equals(before[view.name])
        path = Lake(lake_dir).partition_path(HISTORY_ZONE, view.name, day)
        assert (path.stat().st_mtime_ns != written[view.name]) == (view.name == "user_activity_realtime")


def test_a_day_without_offline_features_is_refused_before_flink_runs(first_run, lake_dir):
    day = LAST_DAY + timedelta(days=1)
    result = run_pipeline(lake_dir, day, day, selection=HISTORY, raise_on_error=False)
    assert not result.success
    [failure] = result.get_step_failure_events()
    assert f"offline/user_activity_realtime has no partition for {day}" in failure.event_specific_data.error.message
    assert not (lake_dir / "streaming" / "interactions" / "backfill" / f"{day}_{day}").exists()
