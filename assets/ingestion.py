"""Ingestion: one daily-partitioned warehouse table per landing stream, each with its
great-expectations check (blocking: bad data must not reach features) and a quarantine check."""

from __future__ import annotations

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetsDefinition,
    BackfillPolicy,
    MaterializeResult,
    asset,
)

from assets.metadata import frame_metadata, quality_gate, table
from assets.partitions import daily_partitions, partition_days
from engines.data.expectations import Suite, gxe
from engines.data.ingest import load_day, write_day
from feature_defs.dsl import Source
from feature_defs.sources import abuse_reports, all_sources, interactions, items, users
from resources.lake import LakeResource
from resources.quality import QualityResource

EXTRA_EXPECTATIONS = {
    interactions.name: [
        gxe.ExpectColumnValuesToBeInSet(column="event_type", value_set=["impression", "click", "play", "purchase"]),
        gxe.ExpectColumnValuesToNotBeNull(column="user_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
        gxe.ExpectColumnValuesToBeBetween(column="amount", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="play_seconds", min_value=0),
    ],
    abuse_reports.name: [
        gxe.ExpectColumnValuesToBeInSet(
            column="reason", value_set=["spam", "harassment", "scam", "ip_violation", "inappropriate"]
        ),
    ],
    items.name: [
        gxe.ExpectColumnValuesToBeBetween(column="price", min_value=0),
        gxe.ExpectColumnValuesToNotBeNull(column="category"),
        gxe.ExpectColumnValuesToNotBeNull(column="mesh_path"),
    ],
    users.name: [gxe.ExpectColumnValuesToBeInSet(column="region", value_set=["us", "eu", "apac"])],
}


def warehouse_suite(source: Source) -> Suite:
    return Suite(
        f"warehouse_{source.name}",
        [
            gxe.ExpectTableColumnsToMatchSet(column_set=source.columns, exact_match=True),
            gxe.ExpectColumnValuesToNotBeNull(column=source.key),
            gxe.ExpectColumnValuesToBeUnique(column=source.key),
            gxe.ExpectColumnValuesToNotBeNull(column=source.timestamp_field),
            *EXTRA_EXPECTATIONS.get(source.name, []),
        ],
    )


def warehouse_key(source: Source) -> AssetKey:
    """The asset that writes the source's warehouse table: its ingestion, or the asset computing it."""
    return AssetKey(source.produced_by.split("/")) if source.produced_by else AssetKey(["warehouse", source.name])


def ingestion_asset(source: Source) -> AssetsDefinition:
    key = warehouse_key(source)
    suite = warehouse_suite(source)

    @asset(
        key=key,
        group_name="ingestion",
        description=f"{source.description}. Loaded daily from landing/{source.name}; malformed files are quarantined.",
        partitions_def=daily_partitions,
        backfill_policy=BackfillPolicy.single_run(),
        kinds={"polars", "parquet"},
        owners=["team:data-platform"],
        tags={"domain": "events" if source.kind == "events" else "dimensions"},
        check_specs=[
            AssetCheckSpec(
                "great_expectations", asset=key, blocking=True, description=f"great-expectations suite {suite.name}"
            ),
            AssetCheckSpec("no_quarantined_files", asset=key, description="Every landing file of the day was loadable"),
        ],
    )
    def _ingest(context, lake: LakeResource, quality: QualityResource):
        days, frames, reports = partition_days(context), [], []
        for day in days:
            frame, report = load_day(lake.get_client(), source, day)
            for name, problem in report.quarantined.items():
                context.log.error(f"quarantined landing/{source.name}/date={day}/{name}: {problem}")
            context.log.info(f"{source.name} {day}: {report.rows} rows from {len(report.files_loaded)} file(s)")
            frames.append(frame)
            reports.append(report)
        yield from quality_gate(quality, suite, dict(zip(days, frames)), source.name)
        for day, day_frame in zip(days, frames):
            write_day(lake.get_client(), source, day, day_frame)
        quarantined = [
            {"day": r.day.isoformat(), "file": f, "problem": p} for r in reports for f, p in r.quarantined.items()
        ]
        yield MaterializeResult(
            metadata={
                **frame_metadata(pl.concat(frames), source.timestamp_field),
                "days": table(
                    [
                        {
                            "day": r.day.isoformat(),
                            "rows": r.rows,
                            "files": len(r.files_loaded),
                            "quarantined": len(r.quarantined),
                            "duplicates_dropped": r.duplicate_rows,
                        }
                        for r in reports
                    ]
                ),
                "quarantined_files": table(quarantined),
            }
        )
        yield AssetCheckResult(
            check_name="no_quarantined_files",
            passed=not quarantined,
            severity=AssetCheckSeverity.WARN,
            metadata={"quarantined_files": table(quarantined)},
        )

    return _ingest


ingestion_assets = [ingestion_asset(s) for s in all_sources]
