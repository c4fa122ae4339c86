"""Streaming features.

- `streaming/<source>`: one asset per event source with streaming views. Materializing it makes
  sure the Flink job runs (starting it from its newest checkpoint if it is not running) and records
  its health; `streaming_job_sensor` (orchestration/streaming.py) watches it between runs.
- `streaming_history/<view>`: the backfill. The same compiled SQL in Flink's batch mode over
  landing partitions gives every window a view emitted (or would have) on those days, the
  training-time record of what was served online. Daily partitions; a range is one Flink job.
"""

from dataclasses import replace

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    TimeWindowPartitionMapping,
    asset,
    multi_asset,
)
from pydantic import Field

from assets.features import offline_key
from assets.ingestion import warehouse_key
from assets.metadata import table
from assets.partitions import daily_partitions, partition_days
from engines.features.feature_tables import OFFLINE_ZONE
from engines.features.point_in_time import record_history_slide
from engines.streaming import (
    HISTORY_ZONE,
    JobHealth,
    backfill,
    days_before,
    differences_from_offline,
    rows_by_day,
    streaming_sources,
    window_rows,
)
from feature_defs import catalogue
from feature_defs.compile.polars import TIMESTAMP
from resources.flink import FlinkResource
from resources.lake import LakeResource


def streaming_key(source: str) -> AssetKey:
    return AssetKey(["streaming", source])


def health_metadata(health: JobHealth) -> dict:
    meta = {
        "status": health.status,
        "healthy": health.healthy,
        "flink_job_id": health.job_id or "",
        "checkpoint": health.checkpoint or "",
        "records_read": health.records,
        "malformed_events": health.malformed,
        "late_events": health.late,
    }
    if health.checkpoint_age_seconds is not None:
        meta["checkpoint_age_seconds"] = health.checkpoint_age_seconds
    if health.lag_seconds is not None:
        meta["lag_seconds"] = health.lag_seconds
    if health.error:
        meta["error"] = MetadataValue.md(f"```\n{health.error}\n```")
    if health.log_dir:
        meta["log_dir"] = MetadataValue.path(health.log_dir)
    return meta


def streaming_job_asset(source: str) -> AssetsDefinition:
    views = [v.name for v in catalogue.views if v.streaming and v.source.name == source]

    @asset(
        key=streaming_key(source),
        group_name="streaming",
        description=f"The Flink job that keeps the streaming views {', '.join(views)} fresh in the online store, "
        f"compiled from the feature DSL and fed by the {source} event stream. Materializing it "
        "starts the job if it is not running (from its newest checkpoint) and records its health.",
        deps=[AssetKey("feature_registry")],  # pushes need the views' PushSources registered
        kinds={"flink", "feast"},
        owners=["team:ml-platform"],
        tags={"mlplane/streaming": "true"},
    )
    def _streaming_job(context, flink: FlinkResource) -> MaterializeResult:
        health = flink.health(source)
        launched: dict = {}
        if health.healthy:
            flink.start_pusher(source)  # no-op when it runs
        else:
            if health.status not in ("NOT_STARTED",):
                context.log.warning(f"{health.name} was {health.status}: {health.error}; restarting from checkpoint")
            health, launched = flink.launch(context, source)
        return MaterializeResult(
            metadata={
                **health_metadata(health),
                "views": ", ".join(views),
                "restored_from": launched.get("restored_from") or "",
            }
        )

    return _streaming_job


def history_key(view: str) -> AssetKey:
    return AssetKey([HISTORY_ZONE, view])


MATCHES_OFFLINE = "matches_offline_features"


class HistoryConfig(Config):
    slide_seconds: int | None = Field(
        default=None,
        description="How often each window is recorded; default the "
        "live job's FlinkResource.slide_seconds, which the "
        "training join (engines.features.point_in_time) requires",
    )


def streaming_history_asset(source: str) -> AssetsDefinition:
    all_views = [v for v in catalogue.views if v.streaming and v.source.name == source]
    specs, checks = history_specs(source, all_views)

    @multi_asset(
        name=f"streaming_history_{source}",
        specs=specs,
        check_specs=checks,
        partitions_def=daily_partitions,
        backfill_policy=BackfillPolicy.single_run(),
        can_subset=True,  # the views selected are the views the Flink job computes
    )
    def _history(context, config: HistoryConfig, lake: LakeResource, flink: FlinkResource):
        if missing := flink.missing_setting(live=False):  # before any work: the backfill runs on the cluster
            raise Failure(f"the streaming history needs the Flink cluster: {missing}")
        views = [v for v in all_views if history_key(v.name) in context.selected_asset_keys]
        slide = config.slide_seconds or flink.slide_seconds
        days, the_lake = partition_days(context), lake.get_client()
        refuse_missing_inputs(views, slide, days, the_lake)
        settings = replace(flink.job(source).settings, slide_seconds=slide)
        job, counts = backfill(settings, the_lake, days, replace(catalogue, views=tuple(views), services=()))
        context.log.info(f"Flink batch job over {counts['days_staged']} landing days: {counts}")
        per_view = {v.name: rows_by_day(window_rows(job, v), days) for v in views}
        yield from matches_offline_checks(views, per_view, days, the_lake)
        for view in views:
            yield write_history(the_lake, view.name, per_view[view.name], slide, counts, job.state_dir)

    return _history


def history_specs(source: str, views: list) -> tuple[list[AssetSpec], list[AssetCheckSpec]]:
    """One asset per streaming view of the source, each with the check that it equals the offline view."""
    ingested = AssetDep(
        warehouse_key(next(s for s in catalogue.sources if s.name == source)),
        partition_mapping=TimeWindowPartitionMapping(
            start_offset=-days_before(source), allow_nonexistent_upstream_partitions=True
        ),
    )
    specs = [
        AssetSpec(
            history_key(v.name),
            group_name="streaming_history",
            description=f"Every window of streaming view {v.name!r} ending on the day, as the Flink job emits it "
            "(one row per entity and window end, stamped at the end), recomputed from landing with the "
            "same SQL in Flink batch mode.",
            deps=[ingested, offline_key(v)],
            kinds={"flink", "parquet"},
            owners=["team:ml-platform"],
        )
        for v in views
    ]
    checks = [
        AssetCheckSpec(
            MATCHES_OFFLINE,
            asset=history_key(v.name),
            blocking=True,
            description="At each day's end the windows equal the view's offline row of that day "
            "(the polars plan): one definition, one meaning in batch and streaming.",
        )
        for v in views
    ]
    return specs, checks


def refuse_missing_inputs(views: list, slide: int, days: list, the_lake) -> None:
    """Before the Flink job starts: windows must end at midnight, and the offline rows they are
    checked against must exist."""
    if 86400 % slide:
        raise Failure(
            f"slide_seconds={slide} does not divide a day: no window would end at "
            "midnight, where the history is checked against the offline features"
        )
    for view in views:
        missing = sorted(set(days) - set(the_lake.partition_days(OFFLINE_ZONE, view.name)))
        if missing:
            raise Failure(
                f"offline/{view.name} has no partition for {', '.join(map(str, missing))}: "
                "materialize it first, the history is checked against it"
            )


def matches_offline_checks(views: list, per_view: dict, days: list, the_lake):
    """Every check before any write: a mismatch leaves earlier partitions as they were."""
    failed = []
    for view in views:
        differences = []
        for day in days:
            offline = the_lake.read_partition(OFFLINE_ZONE, view.name, day)
            differences += differences_from_offline(view, per_view[view.name][day], offline)
        if differences:
            failed.append(view.name)
        yield AssetCheckResult(
            asset_key=history_key(view.name),
            check_name=MATCHES_OFFLINE,
            passed=not differences,
            metadata={"days": len(days), "differences": table(differences[:20])},
        )
    if failed:
        raise Failure(
            f"the Flink backfill of {', '.join(failed)} disagrees with the offline features; "
            "nothing written (see the check's differences)"
        )


def write_history(the_lake, view: str, frames: dict, slide: int, counts: dict, job_dir) -> MaterializeResult:
    for day, frame in frames.items():
        the_lake.write_partition(HISTORY_ZONE, view, day, frame)
        record_history_slide(the_lake, view, day, slide)
    everything = pl.concat(frames.values())
    return MaterializeResult(
        asset_key=history_key(view),
        metadata={
            "dagster/row_count": everything.height,
            "windows": everything[TIMESTAMP].n_unique(),
            "slide_seconds": slide,
            "rows_per_day": table(
                [
                    {"day": d.isoformat(), "rows": f.height, "windows": f[TIMESTAMP].n_unique()}
                    for d, f in frames.items()
                ]
            ),
            "lines_read": counts["records"],
            "malformed_events": counts["malformed"],
            "flink_jvm_options": counts["jvm_options"] or "default",  # a short backfill skips the optimizing JIT
            "flink_job_dir": MetadataValue.path(str(job_dir)),
        },
    )


streaming_assets = [streaming_job_asset(source) for source in streaming_sources(catalogue)]
streaming_history_assets = [streaming_history_asset(source) for source in streaming_sources(catalogue)]
