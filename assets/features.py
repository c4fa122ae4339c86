"""Offline feature tables (one per feature view, daily partitions) and the Feast feature store:
registry, online store and their checks."""

from __future__ import annotations

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetKey,
    AssetsDefinition,
    BackfillPolicy,
    MaterializeResult,
    TimeWindowPartitionMapping,
    asset,
)

from assets.ingestion import warehouse_key
from assets.metadata import frame_metadata, quality_gate, table
from assets.partitions import daily_partitions, partition_days
from engines.data.expectations import Suite, gxe
from engines.data.interaction_categories import categorized_interactions
from engines.features.feature_tables import OFFLINE_ZONE, build_view_day
from engines.features.skew import online_skew, streaming_regressions, streaming_snapshot
from feature_defs import catalogue
from feature_defs.compile.polars import TIMESTAMP, day_end, lookback
from feature_defs.dsl import Aggregation, FeatureView
from feature_defs.sources import interaction_categories, interactions, items
from resources.feature_store import FeatureStoreResource
from resources.lake import LakeResource
from resources.quality import QualityResource


def offline_key(view: FeatureView) -> AssetKey:
    return AssetKey(["offline", view.name])


def feature_table_suite(view: FeatureView) -> Suite:
    """Derived from the definition: keys present and unique per timestamp, counts never negative."""
    expectations = [gxe.ExpectColumnValuesToNotBeNull(column=k) for k in view.join_keys + [TIMESTAMP]]
    expectations.append(gxe.ExpectCompoundColumnsToBeUnique(column_list=view.join_keys + [TIMESTAMP]))
    for f in view.features:
        if isinstance(f.spec, Aggregation) and f.spec.kind in ("count", "distinct_count"):
            expectations.append(gxe.ExpectColumnValuesToBeBetween(column=f.name, min_value=0))
            expectations.append(gxe.ExpectColumnValuesToNotBeNull(column=f.name))
    return Suite(f"offline_{view.name}", expectations)


def feature_table_asset(view: FeatureView) -> AssetsDefinition:
    key = offline_key(view)
    suite = feature_table_suite(view)
    history_days = 0 if view.is_table_view else lookback(view).days + 1

    @asset(
        key=key,
        group_name="features",
        description=f"{view.description}. Offline table of feature view {view.name!r} "
        f"({len(view.features)} features{', streaming' if view.streaming else ''}).",
        partitions_def=daily_partitions,
        backfill_policy=BackfillPolicy.single_run(),
        deps=[
            AssetDep(
                warehouse_key(view.source),
                partition_mapping=TimeWindowPartitionMapping(
                    start_offset=-history_days, allow_nonexistent_upstream_partitions=True
                ),
            )
        ],
        kinds={"polars", "parquet", "feast"},
        owners=["team:ml-platform"],
        metadata={
            "features": table(
                [{"feature": f.name, "type": view.dtype_of(f), "description": f.description} for f in view.features]
            )
        },
        check_specs=[
            AssetCheckSpec(
                "great_expectations", asset=key, blocking=True, description=f"great-expectations suite {suite.name}"
            )
        ],
    )
    def _feature_table(context, lake: LakeResource, quality: QualityResource):
        days, frames = partition_days(context), []
        for day in days:
            frames.append(build_view_day(lake.get_client(), view, day))
            context.log.info(f"{view.name} {day}: {frames[-1].height} rows")
        yield from quality_gate(quality, suite, dict(zip(days, frames)), f"feature table {view.name}")
        for day, day_frame in zip(days, frames):
            lake.get_client().write_partition(OFFLINE_ZONE, view.name, day, day_frame)
        yield MaterializeResult(
            metadata={
                **frame_metadata(pl.concat(frames), TIMESTAMP),
                "rows_per_day": table([{"day": d.isoformat(), "rows": f.height} for d, f in zip(days, frames)]),
            }
        )

    return _feature_table


feature_table_assets = [feature_table_asset(v) for v in catalogue.views]

INTERACTION_CATEGORIES = warehouse_key(interaction_categories)


@asset(
    key=INTERACTION_CATEGORIES,
    group_name="features",
    description=f"{interaction_categories.description}. One partition per day of warehouse/interactions; the "
    "source of feature view user_category_affinity.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    # the catalogue's earlier days are read too (an item keeps the category it was created with)
    deps=[warehouse_key(interactions), warehouse_key(items)],
    kinds={"polars", "parquet"},
    owners=["team:ml-platform"],
    tags={"domain": "events"},
)
def interaction_categories_table(context, lake: LakeResource) -> MaterializeResult:
    store, rows = lake.get_client(), []
    for day in partition_days(context):
        frame = categorized_interactions(store, day)
        store.write_partition("warehouse", interaction_categories.name, day, frame)
        rows.append(
            {"day": day.isoformat(), "events": frame.height, "without_category": frame["category"].null_count()}
        )
    return MaterializeResult(
        metadata={
            "days": table(rows),
            "events": sum(r["events"] for r in rows),
            "without_category": sum(r["without_category"] for r in rows),
        }
    )


@asset(
    group_name="feature_store",
    description="`feast apply` of the feature DSL: entities, sources, feature views and services in the "
    "Feast registry, plus a generated Feast repository so the feast CLI works on it.",
    kinds={"feast"},
    owners=["team:ml-platform"],
)
def feature_registry(feature_store: FeatureStoreResource) -> MaterializeResult:
    engine = feature_store.get_client()
    engine.apply()
    return MaterializeResult(
        metadata={
            "feature_views": table(
                [
                    {
                        "view": v.name,
                        "entities": ",".join(v.join_keys),
                        "features": len(v.features),
                        "source": v.source.name,
                        "streaming": v.streaming,
                    }
                    for v in catalogue.views
                ]
            ),
            "feature_services": table(
                [{"service": s.name, "views": ",".join(v.name for v in s.views)} for s in catalogue.services]
            ),
            "feature_count": catalogue.feature_count,
            "repo": engine.settings.repo_dir.as_posix(),
        }
    )


ONLINE_CHECK = "online_matches_definition"


@asset(
    group_name="feature_store",
    description="The feature values of every entity as of the end of the newest built day "
    "(engines.features.point_in_time) in the online store (SQLite locally, Redis in production): "
    "a re-run after a correction overwrites; streaming views are the streaming job's, the batch only "
    "fills entities it has "
    "nothing newer for. A range run loads once for the whole range.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[AssetKey("feature_registry"), *[offline_key(v) for v in catalogue.views]],
    kinds={"feast", "redis"},
    owners=["team:ml-platform"],
    check_specs=[
        AssetCheckSpec(
            ONLINE_CHECK,
            asset=AssetKey("online_features"),
            description="Sampled entities: online values of the batch views equal the point-in-"
            "time definition and the warehouse as of the newest day; no streaming "
            "value was replaced by an older batch row",
        )
    ],
)
def online_features(context, lake: LakeResource, feature_store: FeatureStoreResource):
    engine = feature_store.get_client()
    engine.ensure_registry()
    days, root = partition_days(context), lake.get_client().root
    # Re-running an old day must not put old values online: load through the newest built day.
    newest = max(d for v in catalogue.views for d in lake.get_client().partition_days(OFFLINE_ZONE, v.name))
    until = max(days[-1], newest)
    before = streaming_snapshot(engine, root, until)
    engine.materialize_days(days[0], until)
    context.log.info(f"materialized {days[0]}..{until} into the {feature_store.online_store} online store")
    regressions = streaming_regressions(engine, before)
    views = online_skew(engine, root, until)
    failed = [v.view for v in views if not v.passed] + [v for v, n in regressions.items() if n]
    yield AssetCheckResult(
        check_name=ONLINE_CHECK,
        passed=not failed,
        metadata={
            "as_of": day_end(until).isoformat(),
            "views_failing": ", ".join(failed) or "(none)",
            "per_view": table([v.to_row() for v in views]),
            "streaming_values_replaced_by_older": table([{"view": v, "entities": n} for v, n in regressions.items()]),
        },
    )
    rows = [
        {
            "day": day.isoformat(),
            "view": view.name,
            "rows": lake.get_client().read_partition(OFFLINE_ZONE, view.name, day).height,
        }
        for day in days
        for view in catalogue.views
    ]
    yield MaterializeResult(metadata={"offline_rows": table(rows), "online_store": feature_store.online_store})


feature_store_assets = [feature_registry, online_features]
