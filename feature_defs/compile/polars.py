"""Compile feature views to polars plans that build the offline feature tables."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

import polars as pl

from feature_defs.dsl import Aggregation, DType, FeatureView, Ratio, Transform

TIMESTAMP = "event_timestamp"  # the timestamp column of every offline feature table

POLARS_TYPES: dict[DType, pl.DataType] = {
    "int64": pl.Int64(),
    "float64": pl.Float64(),
    "string": pl.String(),
    "bool": pl.Boolean(),
    "timestamp": pl.Datetime("us", "UTC"),
    "int64_list": pl.List(pl.Int64),
    "string_list": pl.List(pl.String),
}


def day_end(day: date) -> datetime:
    """The timestamp of a daily feature row: midnight UTC after the day."""
    return datetime.combine(day + timedelta(days=1), time(), tzinfo=UTC)


def lookback(view: FeatureView) -> timedelta:
    """How much source history one day of the view needs: its longest window plus the zero row."""
    return view.max_window + timedelta(days=1)


def output_schema(view: FeatureView) -> dict[str, pl.DataType]:
    schema: dict[str, pl.DataType] = {k: POLARS_TYPES[e.dtype] for k, e in zip(view.join_keys, view.entities)}
    schema[TIMESTAMP] = POLARS_TYPES["timestamp"]
    for f in view.features:
        schema[f.name] = POLARS_TYPES[view.dtype_of(f)]
    return schema


def build_daily_rows(view: FeatureView, events: pl.LazyFrame, day: date) -> pl.LazyFrame:
    """One row per entity for an event view at the end of `day` (see build_rows_at)."""
    return build_rows_at(view, events, day_end(day))


def build_rows_at(view: FeatureView, events: pl.LazyFrame, end: datetime) -> pl.LazyFrame:
    """One row per entity for an event view, every aggregation ending at `end`.

    `events` must hold the source rows of at least [end - lookback(view), end); more is fine.
    Entities seen in that span get a row, so windows that emptied out give zeros, not stale values.
    """
    if view.is_table_view:
        raise ValueError(f"feature view {view.name!r} is a table view; use build_table_rows")
    ts = pl.col(view.source.timestamp_field)
    keys = [pl.col(view.source_column(k)).alias(k) for k in view.join_keys]
    in_span = (ts >= end - lookback(view)) & (ts < end)
    scoped = events.filter(in_span).filter(pl.all_horizontal([k.is_not_null() for k in keys]))

    aggs: list[pl.Expr] = []
    for f in view.features:
        if isinstance(f.spec, Aggregation):
            aggs.append(_aggregate(f.spec, ts, end).alias(f.name))
    rows = scoped.group_by(keys).agg(aggs)
    rows = rows.with_columns(
        [_ratio(f.spec).alias(f.name) for f in view.features if isinstance(f.spec, Ratio)]
    ).with_columns(pl.lit(end).cast(POLARS_TYPES["timestamp"]).alias(TIMESTAMP))
    return _finish(view, rows)


def build_table_rows(view: FeatureView, changes: pl.LazyFrame) -> pl.LazyFrame:
    """Row-level transforms of a table view's changed rows, stamped at their change time."""
    if not view.is_table_view:
        raise ValueError(f"feature view {view.name!r} is not a table view")
    keys = [pl.col(view.source_column(k)).alias(k) for k in view.join_keys]
    rows = changes.select(
        *keys,
        pl.col(view.source.timestamp_field).alias(TIMESTAMP),
        *[f.spec.expr.to_polars().alias(f.name) for f in view.features if isinstance(f.spec, Transform)],
    )
    return _finish(view, rows)


def _aggregate(spec: Aggregation, ts: pl.Expr, end: datetime) -> pl.Expr:
    mask = ts >= spec.start(end)
    if spec.where is not None:
        mask = mask & spec.where.to_polars().fill_null(False)
    if spec.kind == "count":
        return mask.sum().cast(pl.Int64)
    value = spec.of.to_polars().filter(mask)
    match spec.kind:
        case "sum":
            return value.sum()
        case "mean":
            return value.mean()
        case "max":
            return value.max()
        case "min":
            return value.min()
        case "distinct_count":
            return value.drop_nulls().n_unique().cast(pl.Int64)
        case "last_n":
            # most recent first; ties broken by value so the result is deterministic
            ordered = value.sort_by([ts.filter(mask), value], descending=[True, True])
            return ordered.drop_nulls().unique(maintain_order=True).head(spec.n)
    raise ValueError(f"unknown aggregation {spec.kind!r}")


def _ratio(spec: Ratio) -> pl.Expr:
    num, den = pl.col(spec.numerator), pl.col(spec.denominator)
    return pl.when(den > 0).then(num / den).otherwise(None)


def _finish(view: FeatureView, rows: pl.LazyFrame) -> pl.LazyFrame:
    schema = output_schema(view)
    return rows.select([pl.col(name).cast(dtype) for name, dtype in schema.items()]).sort(view.join_keys)
