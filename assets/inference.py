"""Batch inference outputs: daily top-k recommendations of the champion model for every active user."""

import tempfile
from datetime import timedelta
from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    Config,
    Failure,
    MaterializeResult,
    asset,
)
from pydantic import Field

from assets.datasets import timing
from assets.ingestion import warehouse_key
from assets.metadata import table
from assets.models import READS_ITEM_EMBEDDINGS
from assets.partitions import daily_partitions, partition_days
from assets.skew import SKEW_CHECK, SKEW_DESCRIPTION, skew_check_result
from engines.features.point_in_time import item_embeddings_as_of
from engines.models import batch_inference as engine
from feature_defs.outputs import user_recommendations
from feature_defs.sources import interactions, items
from ml.personalization import ITEM_INPUTS, USER_INPUTS, PersonalizationModel
from resources.feature_store import FeatureStoreResource
from resources.flink import FlinkResource
from resources.lake import LakeResource
from resources.ray import RayResource
from resources.registry import ModelRegistryResource
from resources.vector_store import VectorStoreResource

MODEL = "personalization"
KEY = AssetKey(["inference", engine.TABLE])
DRIFT_LIMIT = 0.25  # population stability index above which score distributions count as shifted


class BatchInferenceConfig(Config):
    k: int = Field(default=10, description="Recommendations per user")
    workers: int | None = Field(default=None, description="Ray tasks at once (None: one per CPU of the cluster)")
    batch_size: int = Field(default=4096, description="Users per Ray Data block at most")


@asset(
    key=KEY,
    group_name="inference",
    description="Top-k items for every user active that day: the champion model's user vectors (Ray Data) "
    "query the champion's item vectors in the vector database. Partitioned Parquet in "
    f"{engine.ZONE}/{engine.TABLE}/date=D, and one row per user in the online store "
    f"(feature service `{user_recommendations.service}`).",
    partitions_def=daily_partitions,
    deps=[
        AssetKey(["models", f"{MODEL}_champion"]),
        warehouse_key(interactions),
        warehouse_key(items),
        *(AssetKey(["offline", tower.view]) for tower in USER_INPUTS + ITEM_INPUTS),
        READS_ITEM_EMBEDDINGS,
    ],
    kinds={"ray", "qdrant", "parquet", "feast"},
    owners=["team:ml-platform"],
    op_tags={"mlplane/pool": "cpu"},
    check_specs=[
        AssetCheckSpec(
            "covers_active_users", asset=KEY, blocking=True, description="Every active user has exactly one list"
        ),
        AssetCheckSpec(
            "items_exist",
            asset=KEY,
            blocking=True,
            description="No recommended item is missing from the items dimension",
        ),
        AssetCheckSpec(SKEW_CHECK, asset=KEY, blocking=True, description=SKEW_DESCRIPTION),
        AssetCheckSpec(
            "score_drift",
            asset=KEY,
            description=f"Population stability index of scores vs the previous day <= {DRIFT_LIMIT}",
        ),
    ],
)
def personalization_recommendations(
    context,
    config: BatchInferenceConfig,
    lake: LakeResource,
    ray: RayResource,
    model_registry: ModelRegistryResource,
    vector_store: VectorStoreResource,
    feature_store: FeatureStoreResource,
    flink: FlinkResource,
):
    (day,) = partition_days(context)
    the_lake = lake.get_client()
    registry = model_registry.get_client()
    champion = registry.by_alias(MODEL, "champion")
    if champion is None:
        raise Failure(f"no champion of {MODEL!r} in the registry yet: train and promote one first")
    ray.ensure_started()
    with tempfile.TemporaryDirectory(prefix="batch-inference-") as work:
        model = PersonalizationModel.load(registry.load(MODEL, champion.version, Path(work)))
    active = engine.active_users(the_lake, day)
    existing = engine.existing_items(the_lake, day)
    users = engine.entity_features(the_lake, day, model.spec.user.columns, "user_id", active, timing(flink))
    items = engine.entity_features(the_lake, day, model.spec.item.columns, "item_id", sorted(existing), timing(flink))
    skew_result = skew_check_result(the_lake.root, [users.frame, items.frame], timing(flink), "batch inference")
    yield skew_result
    if not skew_result.passed:
        raise Failure(f"batch inference for {day}: {skew_result.description}; nothing written")
    item_rows = items.frame
    if model.spec.item.embedding_column:  # a model trained with CLIP item embeddings reads them as of the day
        item_rows = item_embeddings_as_of(the_lake.root, item_rows)
    with vector_store.get_client() as store:
        radius = engine.index_items(store, model, item_rows, champion.version)
        recommendations = engine.recommend(
            users.frame,
            store,
            model,
            champion.version,
            radius,
            config.k,
            engine="ray",
            workers=config.workers,
            batch_size=config.batch_size,
        )
    yield from coverage_checks(day, engine.coverage(recommendations, active, existing))
    frame = recommendations.with_columns(model_version=pl.lit(champion.version))
    yield score_drift_check(the_lake, frame, day)
    yield publish(the_lake, feature_store, frame, day, champion.version)


def coverage_checks(day, result: engine.BatchResult):
    """Every active user has one list of existing items; otherwise nothing is written."""
    covered = not result.missing_users and not result.duplicate_users
    yield AssetCheckResult(
        check_name="covers_active_users",
        passed=covered,
        metadata={
            "active_users": result.active_users,
            "missing": len(result.missing_users),
            "duplicated": len(result.duplicate_users),
            "examples": str((result.missing_users + result.duplicate_users)[:10]),
        },
    )
    yield AssetCheckResult(
        check_name="items_exist",
        passed=not result.unknown_items,
        metadata={"unknown_items": len(result.unknown_items), "examples": str(result.unknown_items[:10])},
    )
    if not covered or result.unknown_items:
        raise Failure(
            f"recommendations for {day} failed their checks; nothing written "
            f"(missing users {result.missing_users[:5]}, duplicated {result.duplicate_users[:5]}, "
            f"unknown items {result.unknown_items[:5]})"
        )


def score_drift_check(the_lake, frame: pl.DataFrame, day) -> AssetCheckResult:
    """The population stability index of today's scores against the previous day's lists (a warning)."""
    previous_day = day - timedelta(days=1)
    if previous_day not in the_lake.partition_days(engine.ZONE, engine.TABLE):
        return AssetCheckResult(
            check_name="score_drift",
            passed=True,
            severity=AssetCheckSeverity.WARN,
            metadata={"psi": "no previous day to compare"},
        )
    yesterday = the_lake.read_partition(engine.ZONE, engine.TABLE, previous_day).get_column("score")
    psi = engine.score_drift(frame.get_column("score"), yesterday)
    return AssetCheckResult(
        check_name="score_drift",
        passed=psi <= DRIFT_LIMIT,
        severity=AssetCheckSeverity.WARN,
        metadata={"psi": round(psi, 4), "limit": DRIFT_LIMIT},
    )


def publish(the_lake, feature_store: FeatureStoreResource, frame: pl.DataFrame, day, version) -> MaterializeResult:
    """Writes the day's lists to the lake and, for the newest day only, to the online store."""
    path = the_lake.write_partition(engine.ZONE, engine.TABLE, day, frame)
    served = engine.online_rows(frame, day)
    the_lake.write_partition("offline", user_recommendations.name, day, served)
    # re-running an older day must not replace newer lists online
    newest = day >= max(the_lake.partition_days(engine.ZONE, engine.TABLE))
    if newest:
        store = feature_store.get_client()
        store.ensure_registry()
        store.load_online(user_recommendations.name, served.to_pandas())
    scores = frame.get_column("score")
    return MaterializeResult(
        metadata={
            "dagster/row_count": frame.height,
            "path": str(path),
            "users": frame.get_column("user_id").n_unique(),
            "model_version": version,
            "loaded_online": newest,
            "score_quantiles": table(
                [{"q": q, "score": round(float(scores.quantile(q)), 4)} for q in (0.01, 0.25, 0.5, 0.75, 0.99)]
            ),
            "sample": table(frame.head(10).to_dicts()),
        }
    )


inference_assets = [personalization_recommendations]
