"""Streaming feature jobs: one asset per event source with streaming views. Materializing it makes
sure the Flink job runs (starting it from its newest checkpoint if it is not running) and
records its health; `streaming_job_sensor` (orchestration/sensors.py) watches it between runs."""

from __future__ import annotations

from dagster import AssetKey, AssetsDefinition, MaterializeResult, MetadataValue, asset

from engines.streaming import JobHealth, streaming_sources
from feature_defs import catalogue
from resources.flink import FlinkResource


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
        return MaterializeResult(metadata={**health_metadata(health), "views": ", ".join(views),
                                           "restored_from": launched.get("restored_from") or ""})

    return _streaming_job


streaming_assets = [streaming_job_asset(source) for source in streaming_sources(catalogue)]
