"""Training datasets: labelled impressions with the features of each impression as of its time
(engines.features.point_in_time: the definition batch inference and serving share)."""

from __future__ import annotations

import math
from datetime import timedelta

import polars as pl
from dagster import (
    AssetCheckSpec,
    AssetDep,
    AssetKey,
    BackfillPolicy,
    Failure,
    MaterializeResult,
    TimeWindowPartitionMapping,
    asset,
)

from assets.features import offline_key
from assets.ingestion import warehouse_key
from assets.metadata import frame_metadata, quality_gate, table
from assets.partitions import daily_partitions, partition_days
from assets.skew import SKEW_CHECK, SKEW_DESCRIPTION, skew_check_result
from engines.data.expectations import Suite, gxe
from engines.features.datasets import LABEL_HORIZON, labelled_impressions, training_rows
from engines.features.point_in_time import HISTORY_ZONE, Timing
from feature_defs import personalization_ranking
from feature_defs.sources import interactions
from resources.flink import FlinkResource
from resources.lake import LakeResource
from resources.quality import QualityResource

DATASETS_ZONE = "datasets"
TRAINING_SET = "personalization_training"
KEY = AssetKey(["datasets", TRAINING_SET])

suite = Suite(
    f"dataset_{TRAINING_SET}",
    [
        gxe.ExpectColumnValuesToBeUnique(column="event_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="label_click"),
        gxe.ExpectColumnValuesToNotBeNull(column="user_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
        gxe.ExpectColumnMeanToBeBetween(column="label_click", min_value=0.001, max_value=0.9),
    ],
)


def timing(flink: FlinkResource) -> Timing:
    """How the live streaming job publishes: its slide, and how long after a window's end it is online."""
    if flink.live_rows:  # serving would hold values between window ends that training sets do not model
        raise ValueError(
            "FlinkResource.live_rows is on: online values move with every event, while point-in-time "
            "training data is built from window ends; turn live_rows off to build training data, "
            "batch inference inputs or serving checks"
        )
    return Timing(
        slide_seconds=flink.slide_seconds,
        streaming_delay_seconds=math.ceil(flink.watermark_delay_seconds + flink.checkpoint_interval_ms / 1000),
    )


def _previous_day(key: AssetKey) -> AssetDep:
    return AssetDep(
        key,
        partition_mapping=TimeWindowPartitionMapping(
            start_offset=-1, end_offset=0, allow_nonexistent_upstream_partitions=True
        ),
    )


@asset(
    key=KEY,
    group_name="datasets",
    description="Impressions of the day labelled with clicks and plays in the same session within "
    f"{int(LABEL_HORIZON.total_seconds() // 60)} minutes (the next day's first minutes included, "
    f"so the day waits for the next day's interactions), with feature service "
    f"{personalization_ranking.name!r} as of each impression (engines.features.point_in_time): dimension "
    "views as known at the last daily run, daily views of the previous day, streaming views from "
    "streaming_history at the live slide.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[
        # the day and the next one: late impressions are labelled by clicks after midnight
        AssetDep(
            warehouse_key(interactions), partition_mapping=TimeWindowPartitionMapping(start_offset=0, end_offset=1)
        ),
        *[_previous_day(offline_key(v)) for v in personalization_ranking.views if not v.streaming],
        *[_previous_day(AssetKey([HISTORY_ZONE, v.name])) for v in personalization_ranking.views if v.streaming],
    ],
    kinds={"polars", "parquet"},
    owners=["team:ml-platform"],
    check_specs=[
        AssetCheckSpec(
            "great_expectations", asset=KEY, blocking=True, description=f"great-expectations suite {suite.name}"
        ),
        AssetCheckSpec(SKEW_CHECK, asset=KEY, blocking=True, description=SKEW_DESCRIPTION),
    ],
)
def personalization_training_set(context, lake: LakeResource, flink: FlinkResource, quality: QualityResource):
    the_lake, days = lake.get_client(), partition_days(context)
    ingested = set(the_lake.partition_days("warehouse", interactions.name))
    waiting = [d for d in days if d + timedelta(days=1) not in ingested]
    if waiting:
        raise Failure(
            f"the training set of {', '.join(map(str, waiting))} waits for the next day's interactions "
            f"(labels look {LABEL_HORIZON} past midnight): ingest them first"
        )
    parts = [
        labelled_impressions(
            the_lake.read_partition("warehouse", interactions.name, d),
            the_lake.read_partition("warehouse", interactions.name, d + timedelta(days=1)),
            previous_day=the_lake.read_partition("warehouse", interactions.name, d - timedelta(days=1))
            if d - timedelta(days=1) in ingested  # its late impressions may take credit after midnight
            else None,
        )
        for d in days
    ]
    labelled = pl.concat([p.rows for p in parts])
    result = training_rows(the_lake.root, labelled, personalization_ranking.name, timing(flink))
    rows = result.frame
    skew_result = skew_check_result(the_lake.root, [rows], timing(flink), "training set")
    yield skew_result
    if not skew_result.passed:
        raise Failure(f"training set of {days[0]}..{days[-1]}: {skew_result.description}; nothing written")
    day_of = rows.get_column("event_timestamp").dt.date()
    per_day = {day: rows.filter(day_of == day) for day in days}
    # GX cannot take list columns (last-N features); they are checked in the feature tables
    list_columns = pl.selectors.by_dtype(pl.List(pl.Int64), pl.List(pl.String))
    yield from quality_gate(quality, suite, {d: f.drop(list_columns) for d, f in per_day.items()}, "training set")
    for day, frame in per_day.items():
        the_lake.write_partition(DATASETS_ZONE, TRAINING_SET, day, frame)
    feature_columns = [c for c in rows.columns if c not in labelled.columns]
    yield MaterializeResult(
        metadata={
            **frame_metadata(rows, "event_timestamp"),
            "feature_service": personalization_ranking.name,
            "features": len(feature_columns),
            "positive_rate": round(float(rows.get_column("label_click").mean()), 4),
            "label_horizon_minutes": int(LABEL_HORIZON.total_seconds() // 60),
            "impressions_without_session": sum(p.without_session for p in parts),
            "views_as_of": table(result.report_rows()),
            "rows_per_day": table([{"day": d.isoformat(), "rows": f.height} for d, f in per_day.items()]),
        }
    )


dataset_assets = [personalization_training_set]
