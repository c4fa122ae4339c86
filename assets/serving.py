"""What the online model server needs from the asset graph: the CLIP model in the registry (so the
server loads it by alias like every other model), and the skew check over the feature vectors the
server logged (served online values against the offline values as of the time they were served)."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from datetime import UTC, datetime, time, timedelta
from pathlib import Path

import pandas as pd
import polars as pl
from dagster import AssetCheckResult, AssetCheckSpec, AssetKey, Failure, MaterializeResult, asset

from assets.embeddings import CLIP_MODEL
from assets.metadata import table
from engines.embeddings import current_model
from engines.feature_store import FeatureStoreEngine
from resources.feature_store import FeatureStoreResource
from resources.lake import LakeResource
from resources.registry import ModelRegistryResource

CLIP_REGISTERED = AssetKey(["models", "clip"])
SERVED_FEATURES = AssetKey(["serving", "served_features"])
CLIP_MODEL_NAME = "clip"
CLIP_VERSION_TAG = "mlplane.clip_version"
# the registered folder's layout, as serving/models/encoders.py reads it
WEIGHTS_FILE, CONFIG_FILE = "clip.pt", "clip.json"
SERVED_LOG = Path("serving") / "served_features"  # written by serving/models/feature_log.py
SKEW_CHECK = "served_matches_offline"
TOLERANCE = 1e-6


@asset(key=CLIP_REGISTERED, group_name="embeddings", deps=[CLIP_MODEL], kinds={"mlflow", "pytorch"},
       owners=["team:ml-platform"], tags={"domain": "models"},
       description="The clip_model asset's weights registered in MLflow as `clip` (checksummed) with the alias "
                   "`champion`, for the online model server; a version already registered is not added again.")
def clip_registered(context, lake: LakeResource, model_registry: ModelRegistryResource) -> MaterializeResult:
    spec, clip_version = current_model(lake.lake())
    if not spec.checkpoint:
        raise Failure("clip_model chose no weights file (random weights cannot be served): train it or configure "
                      "a checkpoint")
    registry = model_registry.registry()
    existing = next((v for v in registry.versions(CLIP_MODEL_NAME) if v.tags.get(CLIP_VERSION_TAG) == clip_version),
                    None)
    if existing is None:
        with tempfile.TemporaryDirectory(prefix="clip-register-") as work:
            folder = Path(work) / "clip"
            folder.mkdir()
            shutil.copyfile(spec.checkpoint, folder / WEIGHTS_FILE)
            (folder / CONFIG_FILE).write_text(json.dumps({"model_name": spec.model_name, "version": clip_version}))
            existing = registry.register(CLIP_MODEL_NAME, folder, {
                CLIP_VERSION_TAG: clip_version, "mlplane.dagster_run_id": context.run.run_id,
                "mlplane.dagster_asset": CLIP_REGISTERED.to_user_string()}, metrics={})
    champion = registry.by_alias(CLIP_MODEL_NAME, "champion")
    if champion is None or champion.version != existing.version:
        registry.set_alias(CLIP_MODEL_NAME, "champion", existing.version, who=f"dagster run {context.run.run_id}",
                           reason=f"clip_model {clip_version}")
    return MaterializeResult(metadata={"registry_version": existing.version, "clip_version": clip_version})


def offline_values_as_of(feature_store: FeatureStoreEngine, columns: list[str], entities: pl.DataFrame,
                         newest_day) -> pl.DataFrame:
    """The offline value of each `<view>__<feature>` column for each (user_id, event_timestamp) row, in
    row order. Feast's point-in-time retrieval until engines/point_in_time.py (issue 11) lands: swap
    the body for `features_as_of(lake_root, columns, entities).frame`. Feast drops a daily row a day
    after its timestamp (ttl), so the time is clamped to the end of the newest offline day: served
    after the data ends, the online store holds that day's values."""
    limit = datetime.combine(newest_day + timedelta(days=1), time(), tzinfo=UTC)
    frame = entities.with_columns(pl.col("event_timestamp").clip(upper_bound=limit),
                                  pl.int_range(pl.len()).alias("_row"))
    references = [c.replace("__", ":", 1) for c in columns]
    result = feature_store.store.get_historical_features(
        entity_df=frame.to_pandas(), features=references, full_feature_names=True).to_df()
    result = result.rename(columns={r.replace(":", "__"): c for r, c in zip(references, columns)})
    return pl.from_pandas(result[["_row", *columns]].sort_values("_row").reset_index(drop=True)).drop("_row")


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


@asset(key=SERVED_FEATURES, group_name="serving", kinds={"parquet", "feast"}, owners=["team:ml-platform"],
       tags={"domain": "serving"},
       description="The sample of feature vectors the online model server served (`serving/served_features` in "
                   "the lake), summarized; its check compares each served value with the offline value as of "
                   "the time it was served (train/serve skew).",
       check_specs=[AssetCheckSpec(SKEW_CHECK, asset=SERVED_FEATURES,
                                   description="Every sampled served feature value equals its offline "
                                               "point-in-time value")])
def served_features(context, lake: LakeResource, feature_store: FeatureStoreResource):
    the_lake = lake.lake()
    files = sorted((the_lake.root / SERVED_LOG).glob("date=*/part-*.parquet"))
    if not files:
        raise Failure(f"no served features logged under {the_lake.root / SERVED_LOG}: is the server sampling?")
    logged = pl.concat([pl.read_parquet(f) for f in files]).sort("served_at")
    served = [json.loads(f) for f in logged["features"].to_list()]
    columns = sorted({c for row in served for c in row if "__" in c})
    newest = max(d for c in columns for d in the_lake.partition_days("offline", c.split("__", 1)[0]))
    entities = logged.select("user_id", pl.col("served_at").alias("event_timestamp"))
    offline = offline_values_as_of(feature_store.engine(), columns, entities, newest)
    mismatches = []
    for i, row in enumerate(served):
        for column in columns:
            value = offline[column][i]
            value = value.to_list() if isinstance(value, pl.Series) else value
            if not same_value(row.get(column), value):
                mismatches.append({"user_id": logged["user_id"][i], "served_at": str(logged["served_at"][i]),
                                   "feature": column, "served": str(row.get(column)), "offline": str(value)})
    by_feature = pd.Series([m["feature"] for m in mismatches], dtype=str).value_counts().to_dict()
    yield AssetCheckResult(check_name=SKEW_CHECK, passed=not mismatches, metadata={
        "rows": logged.height, "features": len(columns), "mismatches": len(mismatches),
        "mismatches_by_feature": json.dumps(by_feature), "examples": table(mismatches[:20]) if mismatches else "none"})
    yield MaterializeResult(metadata={"rows": logged.height, "files": len(files), "features": len(columns),
                                      "model_versions": ", ".join(sorted(set(logged["model_version"].to_list())))})


serving_assets = [clip_registered, served_features]
