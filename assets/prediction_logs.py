"""`serving/prediction_logs`: the day's prediction log, taken in from the files the model server wrote
(engines.experimentation.prediction_logs), checked by great-expectations, then written as one partition. Re-running a
day reads the server's files again and replaces the partition whole (late files are picked up)."""

from __future__ import annotations

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

from assets.experiments import CONFIG_KEY as EXPERIMENTS_CONFIG
from assets.metadata import frame_metadata, quality_gate, table
from assets.partitions import partition_days, serving_partitions
from engines.data.expectations import Suite, gxe
from engines.experimentation import prediction_logs as logs
from resources.lake import LakeResource
from resources.quality import QualityResource

KEY = AssetKey(["serving", "prediction_logs"])
MAX_K = 1000  # serving.models.kinds.recommend.MAX_K (assets never import serving)
# What the server answers with: the registry versions of the models it serves (the challenger and the
# champion aliases of personalization, set by its training and promotion assets; CLIP behind search and
# the encoders) and the experiments file that routes each request. A day's answers come from the versions
# registered up to that day: the lineage names the day before and the day itself.
SERVED_MODELS = [
    AssetDep(
        AssetKey(["models", name]),
        partition_mapping=TimeWindowPartitionMapping(
            start_offset=-1, end_offset=0, allow_nonexistent_upstream_partitions=True
        ),
    )
    for name in ("personalization", "personalization_champion")
] + [AssetKey(["models", "clip"])]
READS = [*SERVED_MODELS, EXPERIMENTS_CONFIG]

suite = Suite(
    "serving_prediction_logs",
    [
        gxe.ExpectColumnValuesToNotBeNull(column="request_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="served_at"),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["request_id", "role", "variant"]),
        gxe.ExpectColumnValuesToBeInSet(column="role", value_set=[logs.LIVE, logs.SHADOW]),
        gxe.ExpectColumnValuesToBeInSet(column="status", value_set=[logs.OK, logs.ERROR]),
        gxe.ExpectColumnValueLengthsToEqual(column="inputs_hash", value=64),
        gxe.ExpectColumnValuesToBeBetween(column="latency_ms", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="n_items", min_value=0, max_value=MAX_K),
        # a live answer that went out has a model version; only a failed shadow may lack one
        gxe.ExpectColumnValuesToNotBeNull(column="served_version"),
    ],
)


def for_validation(frame: pl.DataFrame) -> pl.DataFrame:
    """GX takes no list columns: their lengths instead, and the version of every ok record."""
    return frame.with_columns(
        pl.col("item_ids").list.len().fill_null(0).alias("n_items"),
        pl.when(pl.col("status") == logs.OK)
        .then(pl.col("model_version"))
        .otherwise(pl.lit("-"))
        .alias("served_version"),
    ).drop("item_ids", "scores")


def latency_table(frame: pl.DataFrame) -> list[dict]:
    """Latency percentiles per served model and version, from the live records."""
    live = frame.filter(pl.col("role") == logs.LIVE)
    stats = (
        live.group_by("endpoint", "served_model", "model_version")
        .agg(
            pl.len().alias("answers"),
            *[
                pl.col("latency_ms").quantile(q, "linear").round(3).alias(f"p{int(q * 100)}_ms")
                for q in (0.5, 0.9, 0.99)
            ],
        )
        .sort("endpoint", "served_model", "model_version")
    )
    return stats.to_dicts()


@asset(
    key=KEY,
    group_name="serving",
    description="Every answer of the online model server on the day (live and shadow): request id, time, user, "
    "experiment and variant, model version, hash of the inputs (the inputs where the model card allows), "
    "outputs and latency, taken in from the server's files behind a great-expectations check.",
    partitions_def=serving_partitions,
    deps=READS,
    # a day per run, as monitoring/online_accuracy's in the online_monitoring job (one policy per job)
    backfill_policy=BackfillPolicy.multi_run(1),
    kinds={"parquet", "greatexpectations"},
    owners=["team:ml-platform"],
    tags={"domain": "serving"},
    check_specs=[
        AssetCheckSpec(
            "great_expectations", asset=KEY, blocking=True, description=f"great-expectations suite {suite.name}"
        )
    ],
)
def prediction_logs(context, lake: LakeResource, quality: QualityResource):
    the_lake, days = lake.get_client(), partition_days(context)
    frames = {
        day: logs.read_spool(the_lake.root, day).sort("served_at", "request_id", "role", "variant") for day in days
    }
    if all(f.is_empty() for f in frames.values()):
        raise Failure(
            f"no prediction logs for {', '.join(map(str, days))} under "
            f"{the_lake.root / logs.ZONE / logs.SPOOL}: is the model server running and logging?"
        )
    yield from quality_gate(quality, suite, {d: for_validation(f) for d, f in frames.items()}, "prediction logs")
    for day, frame in frames.items():
        the_lake.write_partition(logs.ZONE, logs.TABLE, day, frame)
    everything = pl.concat(list(frames.values()))
    roles = everything.group_by("role", "status").len().sort("role", "status").to_dicts()
    yield MaterializeResult(
        metadata={
            **frame_metadata(everything.drop("item_ids", "scores"), "served_at"),
            "by_role": table(roles),
            "latency_by_model": table(latency_table(everything)),
        }
    )
