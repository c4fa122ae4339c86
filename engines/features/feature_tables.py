"""Build one day of an offline feature table from warehouse partitions with the view's polars plan."""

from __future__ import annotations

from datetime import date, timedelta

import polars as pl

from engines.data.lake import Lake
from feature_defs.compile.polars import build_daily_rows, build_table_rows, lookback
from feature_defs.dsl import FeatureView

OFFLINE_ZONE = "offline"


class MissingUpstreamError(RuntimeError):
    pass


def source_days(lake: Lake, view: FeatureView, day: date) -> list[date]:
    """Warehouse days the view needs for `day`; days before the source's first partition do not exist.
    A gap inside the source's history is an error: the features would be silently wrong."""
    if view.is_table_view:
        wanted = [day]
    else:
        span = (lookback(view) + timedelta(days=1)).days  # the window may start inside the first day
        wanted = [day - timedelta(days=n) for n in range(span - 1, -1, -1)]
    existing = lake.partition_days("warehouse", view.source.name)
    first = existing[0] if existing else None
    if first is None or day < first:
        raise MissingUpstreamError(
            f"feature view {view.name!r} for {day}: source {view.source.name!r} has no warehouse partition "
            f"on or before {day}; ingest it first"
        )
    needed = [d for d in wanted if d >= first]
    missing = [d.isoformat() for d in needed if d not in set(existing)]
    if missing:
        raise MissingUpstreamError(
            f"feature view {view.name!r} for {day}: warehouse partitions of {view.source.name!r} missing: "
            f"{', '.join(missing)}; ingest them first"
        )
    return needed


def build_view_day(lake: Lake, view: FeatureView, day: date) -> pl.DataFrame:
    scan = lake.scan_partitions("warehouse", view.source.name, source_days(lake, view, day))
    plan = build_table_rows(view, scan) if view.is_table_view else build_daily_rows(view, scan, day)
    return plan.collect()
