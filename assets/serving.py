"""What the online model server needs from the asset graph: the registry's champion CLIP (which the
server, the embeddings and search follow), and the skew check over the feature vectors the
server logged (served online values against the offline values as of the time they were served)."""

from __future__ import annotations

import json
import math
from datetime import date, timedelta
from pathlib import Path

import pandas as pd
import polars as pl
from dagster import AssetCheckResult, AssetCheckSpec, AssetKey, Failure, MaterializeResult, asset

from assets.datasets import timing
from assets.embeddings import CLIP_CHAMPION, CLIP_MODEL
from assets.metadata import table
from engines.features.point_in_time import Timing, features_as_of
from engines.retrieval import clip_registry
from engines.retrieval.embeddings import save_model_manifest
from feature_defs.compile.polars import POLARS_TYPES, TIMESTAMP, day_end
from resources.flink import FlinkResource
from resources.lake import LakeResource
from resources.registry import ModelRegistryResource

CLIP_REGISTERED = CLIP_CHAMPION  # the registry's champion CLIP
SERVED_FEATURES = AssetKey(["serving", "served_features"])
SERVED_LOG = Path("serving") / "served_features"  # written by serving/models/hooks/feature_log.py
SKEW_CHECK = "served_matches_offline"
TOLERANCE = 1e-6


@asset(
    key=CLIP_REGISTERED,
    group_name="embeddings",
    deps=[CLIP_MODEL],
    kinds={"mlflow", "pytorch"},
    owners=["team:ml-platform"],
    tags={"domain": "models"},
    description="The champion CLIP: the version the registry's `clip` model has under the alias `champion` "
    "(clip_model registers and gates each trained version; `mlplane models rollback clip` moves it back), "
    "downloaded into the lake with its checksums verified and recorded in models/clip/current.json. "
    "clip_champion_sensor materializes it with a re-embedding of the catalogue whenever the champion changes.",
)
def clip_registered(context, lake: LakeResource, model_registry: ModelRegistryResource) -> MaterializeResult:
    store = lake.get_client()
    registry = model_registry.get_client()
    try:
        spec, version, registry_version = clip_registry.champion(registry, clip_registry.cache_folder(store.root))
    except LookupError as error:
        raise Failure(str(error)) from error
    save_model_manifest(store, spec, version, registry.get(clip_registry.MODEL_NAME, registry_version).metrics)
    context.log.info(f"champion CLIP: {version} (registry v{registry_version})")
    return MaterializeResult(
        metadata={
            "registry_version": registry_version,
            "clip_version": version,
            "checkpoint": spec.checkpoint,
            "champion_history": table(
                [
                    {k: str(e.get(k, "")) for k in ("at", "action", "from", "version", "who", "reason")}
                    for e in registry.alias_log(clip_registry.MODEL_NAME, clip_registry.CHAMPION)[-10:]
                ]
            ),
        }
    )


def offline_values_as_of(
    lake_root: Path, columns: list[str], entities: pl.DataFrame, newest_day: date, timing: Timing
) -> pl.DataFrame:
    """The value of each `<view>__<feature>` column for each (user_id, event_timestamp) row by the one
    definition (engines.features.point_in_time), in row order. Served after the data ends, the online store
    holds the newest day's values (its daily rows, its catalogue, the streaming windows ending at its
    midnight, online once the live job's delay has passed): a time after that is read as of then."""
    limit = day_end(newest_day) + timedelta(seconds=timing.streaming_delay_seconds)
    frame = entities.with_columns(pl.col(TIMESTAMP).cast(POLARS_TYPES["timestamp"]).clip(upper_bound=limit))
    return features_as_of(lake_root, columns, frame, timing).frame.select(columns)


def same_value(served, offline) -> bool:
    missing = [v is None or (isinstance(v, float) and math.isnan(v)) for v in (served, offline)]
    if any(missing):
        return all(missing)
    if isinstance(served, list) or hasattr(offline, "__len__") and not isinstance(offline, str):
        offline = list(offline)
        return len(served) == len(offline) and all(same_value(a, b) for a, b in zip(served, offline))
    if isinstance(served, bool | int | float) and not isinstance(offline, str):
        return math.isclose(float(served), float(offline), rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    return served == offline


@asset(
    key=SERVED_FEATURES,
    group_name="serving",
    kinds={"parquet", "polars"},
    owners=["team:ml-platform"],
    tags={"domain": "serving"},
    description="The sample of feature vectors the online model server served (`serving/served_features` in "
    "the lake), summarized; its check compares each served value with the offline value as of "
    "the time it was served (train/serve skew).",
    check_specs=[
        AssetCheckSpec(
            SKEW_CHECK,
            asset=SERVED_FEATURES,
            description="Every sampled served feature value equals its offline point-in-time value",
        )
    ],
)
def served_features(context, lake: LakeResource, flink: FlinkResource):
    the_lake = lake.get_client()
    files = sorted((the_lake.root / SERVED_LOG).glob("date=*/part-*.parquet"))
    if not files:
        raise Failure(f"no served features logged under {the_lake.root / SERVED_LOG}: is the server sampling?")
    # parts written before the consent column have none: read them beside the newer ones
    logged = pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed").sort("served_at")
    served = [json.loads(f) for f in logged["features"].to_list()]
    columns = sorted({c for row in served for c in row if "__" in c})
    newest = max(d for c in columns for d in the_lake.partition_days("offline", c.split("__", 1)[0]))
    entities = logged.select("user_id", pl.col("served_at").alias(TIMESTAMP))
    offline = offline_values_as_of(the_lake.root, columns, entities, newest, timing(flink))
    mismatches = []
    for i, row in enumerate(served):
        for column in columns:
            value = offline[column][i]
            value = value.to_list() if isinstance(value, pl.Series) else value
            if not same_value(row.get(column), value):
                mismatches.append(
                    {
                        "user_id": logged["user_id"][i],
                        "served_at": str(logged["served_at"][i]),
                        "feature": column,
                        "served": str(row.get(column)),
                        "offline": str(value),
                    }
                )
    by_feature = pd.Series([m["feature"] for m in mismatches], dtype=str).value_counts().to_dict()
    yield AssetCheckResult(
        check_name=SKEW_CHECK,
        passed=not mismatches,
        metadata={
            "rows": logged.height,
            "features": len(columns),
            "mismatches": len(mismatches),
            "mismatches_by_feature": json.dumps(by_feature),
            "examples": table(mismatches[:20]) if mismatches else "none",
        },
    )
    yield MaterializeResult(
        metadata={
            "rows": logged.height,
            "files": len(files),
            "features": len(columns),
            "model_versions": ", ".join(sorted(set(logged["model_version"].to_list()))),
        }
    )


serving_assets = [clip_registered, served_features]
