"""Shared by the asset modules: metadata (tables, row counts, null rates, freshness) and the quality gate."""

from __future__ import annotations

from datetime import UTC, date, datetime

import polars as pl
from dagster import AssetCheckResult, Failure, MetadataValue, TableColumn, TableRecord, TableSchema

from engines.data.expectations import Suite
from resources.quality import QualityResource


def table(rows: list[dict]) -> MetadataValue:
    """A Dagster table from a list of dicts (all with the same keys)."""
    if not rows:
        return MetadataValue.md("(none)")
    columns = list(rows[0])
    return MetadataValue.table(
        records=[TableRecord({c: _plain(r[c]) for c in columns}) for r in rows],
        schema=TableSchema(columns=[TableColumn(c, _type(rows[0][c])) for c in columns]),
    )


def frame_metadata(frame: pl.DataFrame, timestamp_column: str | None = None) -> dict:
    from engines.data.quality import null_rates  # with great-expectations: when a run reports, not at load

    meta: dict = {"dagster/row_count": frame.height}
    rates = null_rates(frame) if frame.height else {}
    nonzero = {c: r for c, r in rates.items() if r > 0}
    meta["null_rates"] = table([{"column": c, "null_rate": round(r, 4)} for c, r in nonzero.items()])
    if timestamp_column and frame.height:
        latest = frame.get_column(timestamp_column).max()
        meta["latest_record_at"] = MetadataValue.timestamp(latest)
        lag = datetime.now(UTC) - latest
        meta["freshness_lag_hours"] = round(lag.total_seconds() / 3600, 2)
    return meta


def quality_gate(quality: QualityResource, suite: Suite, frames: dict[date, pl.DataFrame], what: str):
    """Validate each day's frame and yield the `great_expectations` check result. On failure, raise
    before the caller writes anything: earlier partitions stay and nothing downstream runs."""
    engine = quality.get_client()  # one GX context for all days
    summaries = [engine.validate(suite, frame, run_name=f"{suite.name} {day}") for day, frame in frames.items()]
    passed = all(s.success for s in summaries)
    yield AssetCheckResult(
        check_name="great_expectations",
        passed=passed,
        metadata={
            "suite": suite.name,
            "runs": len(summaries),
            "failed_expectations": sum(len(s.failures) for s in summaries),
            "results": table(
                [
                    {
                        "run": s.run_name,
                        "expectation": o.expectation,
                        "column": o.column or "",
                        "success": o.success,
                        "observed": o.observed,
                    }
                    for s in summaries
                    for o in s.outcomes
                ]
            ),
        },
    )
    if not passed:
        failures = "; ".join(
            f"{s.run_name}: {o.expectation}({o.column}) {o.observed}" for s in summaries for o in s.failures
        )
        raise Failure(f"{what} failed data quality, nothing written: {failures}")


def _plain(value):
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _type(value) -> str:
    return {bool: "bool", int: "int", float: "float"}.get(type(value), "string")
