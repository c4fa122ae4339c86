"""Training datasets: labelled impressions with point-in-time-correct features from Feast."""

from __future__ import annotations

import great_expectations.expectations as gxe
import polars as pl
from dagster import (
    AssetCheckSpec,
    AssetDep,
    AssetKey,
    BackfillPolicy,
    MaterializeResult,
    TimeWindowPartitionMapping,
    asset,
)

from assets.features import offline_key
from assets.ingestion import warehouse_key
from assets.metadata import frame_metadata, quality_gate, table
from assets.partitions import daily_partitions, partition_days
from engines.datasets import labelled_impressions, training_rows
from engines.quality import Suite
from feature_defs import personalization_ranking
from feature_defs.sources import interactions
from resources.feature_store import FeatureStoreResource
from resources.lake import LakeResource
from resources.quality import QualityResource

DATASETS_ZONE = "datasets"
TRAINING_SET = "personalization_training"
KEY = AssetKey(["datasets", TRAINING_SET])

suite = Suite(f"dataset_{TRAINING_SET}", [
    gxe.ExpectColumnValuesToBeUnique(column="event_id"),
    gxe.ExpectColumnValuesToNotBeNull(column="label_click"),
    gxe.ExpectColumnValuesToNotBeNull(column="user_id"),
    gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
    gxe.ExpectColumnMeanToBeBetween(column="label_click", min_value=0.001, max_value=0.9),
])


@asset(
    key=KEY,
    group_name="datasets",
    description="Impressions of the day labelled with later clicks and plays in the same session, joined "
                f"point-in-time with feature service {personalization_ranking.name!r} (Feast historical "
                "retrieval): every feature was observed before the impression it describes.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[
        warehouse_key(interactions),
        AssetKey("feature_registry"),
        # rows stamped at the start of day D come from day D-1's partition
        *[AssetDep(offline_key(v), partition_mapping=TimeWindowPartitionMapping(
            start_offset=-1, end_offset=0, allow_nonexistent_upstream_partitions=True))
          for v in personalization_ranking.views],
    ],
    kinds={"feast", "parquet", "duckdb"},
    owners=["team:ml-platform"],
    check_specs=[AssetCheckSpec("great_expectations", asset=KEY, blocking=True,
                                description=f"great-expectations suite {suite.name}")],
)
def personalization_training_set(context, lake: LakeResource, feature_store: FeatureStoreResource,
                                 quality: QualityResource):
    engine = feature_store.engine()
    engine.ensure_registry()
    days = partition_days(context)
    labelled = pl.concat([labelled_impressions(lake.lake().read_partition("warehouse", interactions.name, d))
                          for d in days])
    rows = training_rows(engine, labelled, personalization_ranking.name)
    day_of = rows.get_column("event_timestamp").dt.date()
    per_day = {day: rows.filter(day_of == day) for day in days}
    # GX cannot take list columns (last-N features); they are checked in the feature tables
    list_columns = pl.selectors.by_dtype(pl.List(pl.Int64), pl.List(pl.String))
    yield from quality_gate(quality, suite, {d: f.drop(list_columns) for d, f in per_day.items()}, "training set")
    for day, frame in per_day.items():
        lake.lake().write_partition(DATASETS_ZONE, TRAINING_SET, day, frame)
    feature_columns = [c for c in rows.columns if c not in labelled.columns]
    yield MaterializeResult(metadata={
        **frame_metadata(rows, "event_timestamp"),
        "feature_service": personalization_ranking.name,
        "features": len(feature_columns),
        "positive_rate": round(float(rows.get_column("label_click").mean()), 4),
        "rows_per_day": table([{"day": d.isoformat(), "rows": f.height} for d, f in per_day.items()]),
    })


dataset_assets = [personalization_training_set]
