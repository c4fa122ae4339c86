"""Train/serve consistency through Dagster: the skew checks on the training set and on the online
store pass on the pipeline's lake and fail when each defect of issue 11 is put back; the online store
holds the definition "now" on real Redis as on SQLite. (Defect 1, batch inference reading a day's
change set, is put back in tests/models/test_batch_inference.py, which has a trained model.)"""

from __future__ import annotations

import shutil
import uuid
from datetime import timedelta

import pandas as pd
import polars as pl
import pytest
from dagster import AssetSelection, DagsterInstance, materialize

import engines.features.point_in_time as point_in_time
from assets import all_assets
from assets.features import ONLINE_CHECK
from assets.skew import SKEW_CHECK
from engines.data.lake import Lake
from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings
from engines.features.feature_tables import build_view_day
from feature_defs import catalogue
from feature_defs.compile.polars import day_end
from resources.feature_store import FeatureStoreResource
from tests.conftest import FIRST_DAY, LAST_DAY, local_resources
from tests.services import REDIS

ONLINE = AssetSelection.assets("online_features")
TRAINING_SET = AssetSelection.groups("datasets")


@pytest.fixture()
def lake_copy(pipeline_dir, tmp_path):
    """The pipeline's lake, copied: these tests write corrections and online values into it."""
    root = tmp_path / "lake"
    shutil.copytree(pipeline_dir, root, ignore=shutil.ignore_patterns("streaming"))
    return root


def run(data_dir, selection, feature_store: FeatureStoreResource | None = None, day=LAST_DAY):
    resources = local_resources(data_dir)
    if feature_store is not None:
        resources["feature_store"] = feature_store
    return materialize(
        all_assets,
        selection=selection,
        resources=resources,
        partition_key=day.isoformat(),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def check(result, name: str):
    [evaluation] = [c for c in result.get_asset_check_evaluations() if c.check_name == name]
    return evaluation


def failing_views(evaluation) -> dict[str, dict]:
    rows = [dict(r.data) for r in evaluation.metadata["per_view"].value.records]
    return {r["view"]: r for r in rows if r["mismatch_vs_definition"] or r["mismatch_vs_warehouse"]}


def correct_every_price(data_dir) -> None:
    """An upstream correction: every item's price re-delivered doubled, same updated_at; the item
    features rebuilt from the corrected warehouse."""
    lake = Lake(data_dir)
    for day in [d for d in lake.partition_days("warehouse", "items") if d <= LAST_DAY]:
        frame = lake.read_partition("warehouse", "items", day)
        lake.write_partition("warehouse", "items", day, frame.with_columns(pl.col("price") * 2))
        lake.write_partition("offline", "item_content", day, build_view_day(lake, catalogue.view("item_content"), day))


def test_training_set_check_passes_and_catches_streaming_views_read_from_daily_rows(lake_copy, monkeypatch):
    """Defect 2: the streaming views of the training set were the previous day's offline row."""
    assert check(run(lake_copy, TRAINING_SET), SKEW_CHECK).passed

    def daily_row_instead(lake, view, rows, timing):
        day = rows.with_columns((pl.col("event_timestamp").dt.date() - timedelta(days=1)).alias("_day"))
        offline = pl.concat(
            [
                lake.read_partition("offline", view.name, d).with_columns(pl.lit(d).alias("_day"))
                for d in sorted(set(day["_day"].to_list()))
                if d >= FIRST_DAY
            ]
        )
        return day.join(offline.drop("event_timestamp"), on=[*view.join_keys, "_day"], how="left")

    monkeypatch.setattr(point_in_time, "_streaming_values", daily_row_instead)
    before = Lake(lake_copy).read_partition("datasets", "personalization_training", LAST_DAY)
    result = run(lake_copy, TRAINING_SET)
    evaluation = check(result, SKEW_CHECK)
    assert not evaluation.passed and not result.success
    failing = failing_views(evaluation)
    assert {"user_activity_realtime", "item_trending"} <= set(failing)
    assert failing["item_trending"]["mismatch_vs_warehouse"] > 0
    # a blocking check: nothing was written
    assert Lake(lake_copy).read_partition("datasets", "personalization_training", LAST_DAY).equals(before)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_correction_reaches_the_online_store(lake_copy, backend):
    """Re-materializing after a correction overwrites, on Redis as on SQLite."""
    engine = FeatureStoreEngine(
        FeatureStoreSettings(
            repo_dir=lake_copy / f"repo_{backend}",
            offline_root=lake_copy / "offline",
            project=f"t11_{uuid.uuid4().hex[:10]}",
            online_store=backend,
            redis_url=REDIS,
        )
    )
    try:
        engine.apply()
        engine.materialize_days(FIRST_DAY, LAST_DAY)
        items = [{"item_id": i} for i in range(1, 40)]
        before = [v["price"] for _, v in engine.online_view("item_content", items, ["price"])]
        correct_every_price(lake_copy)
        engine.materialize_days(LAST_DAY, LAST_DAY)
        after = [v["price"] for _, v in engine.online_view("item_content", items, ["price"])]
        assert [a for a in after if a is not None] and all(
            a == pytest.approx(2 * b) for a, b in zip(after, before) if b is not None
        )
    finally:
        engine.store.teardown()


def redis_store(data_dir, project: str) -> FeatureStoreResource:
    return FeatureStoreResource(
        lake=local_resources(data_dir)["lake"], project=project, online_store="redis", redis_url=REDIS
    )


def test_online_check_catches_a_redis_store_that_keeps_old_values(lake_copy, monkeypatch):
    """Defect 3: Feast's Redis store skipped rows not newer than the stored ones."""
    store = redis_store(lake_copy, f"t11_{uuid.uuid4().hex[:10]}")
    config_dict = FeatureStoreSettings.config_dict
    monkeypatch.setattr(
        FeatureStoreSettings,
        "config_dict",
        lambda self: {
            **config_dict(self),
            "online_store": {k: v for k, v in config_dict(self)["online_store"].items() if k != "skip_dedup"},
        },
    )
    try:
        assert check(run(lake_copy, ONLINE, store), ONLINE_CHECK).passed
        correct_every_price(lake_copy)
        evaluation = check(run(lake_copy, ONLINE, store), ONLINE_CHECK)
        assert not evaluation.passed
        assert failing_views(evaluation)["item_content"]["mismatch_vs_definition"] > 0
        monkeypatch.undo()  # the fix: the same re-run now overwrites
        assert check(run(lake_copy, ONLINE, store), ONLINE_CHECK).passed
    finally:
        store.get_client().store.teardown()


def test_batch_never_replaces_a_newer_streaming_value(lake_copy, monkeypatch):
    """Defect 4: the daily materialization wrote the streaming views' daily rows over fresher values."""
    engine = local_resources(lake_copy)["feature_store"].get_client()
    view = catalogue.view("item_sales_today")
    rows = Lake(lake_copy).read_partition("offline", view.name, LAST_DAY).to_pandas()
    pushed = rows.assign(
        event_timestamp=pd.Timestamp(day_end(LAST_DAY) + timedelta(minutes=5)), purchases_today=0, clicks_today=0
    )  # the live job, five minutes after midnight
    engine.store.write_to_online_store(view.name, pushed)
    keys = rows[["item_id"]].to_dict("records")

    assert check(run(lake_copy, ONLINE), ONLINE_CHECK).passed
    assert {v["purchases_today"] for _, v in engine.online_view(view.name, keys, ["purchases_today"])} == {0}

    def old_materialize(self, first, last, views=None):  # everything through Feast, streaming views too
        self.store.materialize(
            start_date=day_end(first - timedelta(days=1)),
            end_date=day_end(last),
            feature_views=[v.name for v in catalogue.views if not v.is_table_view],
        )

    monkeypatch.setattr(FeatureStoreEngine, "materialize_days", old_materialize)
    evaluation = check(run(lake_copy, ONLINE), ONLINE_CHECK)
    assert not evaluation.passed
    replaced = {
        dict(r.data)["view"]: dict(r.data)["entities"]
        for r in evaluation.metadata["streaming_values_replaced_by_older"].value.records
    }
    assert replaced[view.name] > 0


def test_the_batch_fills_streaming_entities_the_stream_has_not_seen(lake_copy):
    engine = local_resources(lake_copy)["feature_store"].get_client()
    engine.ensure_registry()
    view = catalogue.view("item_trending")
    offline = Lake(lake_copy).read_partition("offline", view.name, LAST_DAY)
    keys = offline.select("item_id").to_dicts()
    stamps = engine.online_timestamps(view.name, keys)
    assert all(s is not None and s >= day_end(LAST_DAY) for s in stamps)
    values = engine.online_view(view.name, keys, ["impressions_1h"])
    assert [v["impressions_1h"] for _, v in values] == offline["impressions_1h"].to_list()
