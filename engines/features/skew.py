"""Train/serve skew: the feature vectors a model gets on some path (a training set, batch inference,
the online store) against the point-in-time definition (engines.features.point_in_time) and against an
independent recomputation from the warehouse. Plain Python, no Dagster.

The warehouse recomputation reads neither the offline tables nor streaming_history: it takes the
warehouse partitions the definition's rule names and runs the view's polars plan on them, so a
stale, partial or wrongly chosen partition on the path or in the definition shows up as a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

import polars as pl

from engines.data.lake import Lake
from engines.features.point_in_time import (
    LIVE_TIMING,
    FeatureRef,
    Timing,
    ViewKind,
    dimension_versions,
    features_as_of,
    view_kind,
)
from feature_defs import catalogue as default_catalogue
from feature_defs.compile.polars import (
    POLARS_TYPES,
    TIMESTAMP,
    build_rows_at,
    build_table_rows,
    day_end,
    lookback,
    output_schema,
)
from feature_defs.dsl import Aggregation, Catalogue, FeatureView

_ROW = "_sample_row"


@dataclass
class ViewSkew:
    view: str
    kind: str
    rows: int
    mismatch_definition: int  # rows where any feature differs from the definition
    mismatch_warehouse: int  # rows where any feature differs from the warehouse recomputation
    null_rate_path: float
    null_rate_definition: float
    example: str = ""

    @property
    def passed(self) -> bool:
        return (
            not self.mismatch_definition
            and not self.mismatch_warehouse
            and abs(self.null_rate_path - self.null_rate_definition) < 1e-12
        )

    def to_row(self) -> dict:
        return {
            "view": self.view,
            "kind": self.kind,
            "rows": self.rows,
            "mismatch_vs_definition": self.mismatch_definition,
            "mismatch_vs_warehouse": self.mismatch_warehouse,
            "null_rate_path": round(self.null_rate_path, 4),
            "null_rate_definition": round(self.null_rate_definition, 4),
            "null_rate_difference": round(self.null_rate_path - self.null_rate_definition, 4),
            "example": self.example,
        }


def sample_rows(frame: pl.DataFrame, n: int, seed: int = 0) -> pl.DataFrame:
    return frame.sample(min(n, frame.height), seed=seed) if frame.height else frame


def skew(
    lake_root: Path | str,
    path_rows: pl.DataFrame,
    features: list[str],
    timing: Timing = LIVE_TIMING,
    catalogue: Catalogue = default_catalogue,
) -> list[ViewSkew]:
    """Per view: how many of `path_rows` (keys, `event_timestamp`, the `features` columns as the path
    gave them) differ from the definition and from the warehouse, and the null rates."""
    rows = path_rows.with_columns(pl.int_range(pl.len()).alias(_ROW))
    keys = [c for c in rows.columns if c not in features]
    definition = features_as_of(lake_root, features, rows.select(keys), timing, catalogue).frame
    warehouse = warehouse_features(lake_root, features, rows.select(keys), timing, catalogue)
    by_view: dict[str, list[str]] = {}
    for f in features:
        by_view.setdefault(FeatureRef.parse(f).view, []).append(f)
    out = []
    for view, columns in by_view.items():
        differs_def = _differs(rows, definition, columns)
        differs_wh = _differs(rows, warehouse, columns)
        out.append(
            ViewSkew(
                view,
                str(view_kind(catalogue.view(view))),
                rows.height,
                int(differs_def.sum()),
                int(differs_wh.sum()),
                _null_rate(rows, columns[0]),
                _null_rate(definition, columns[0]),
                _example(rows, definition, warehouse, columns, keys, differs_def | differs_wh),
            )
        )
    return out


def _example(
    rows: pl.DataFrame,
    definition: pl.DataFrame,
    warehouse: pl.DataFrame,
    columns: list[str],
    keys: list[str],
    differs: pl.Series,
) -> str:
    """The first differing row: its keys and time, and one feature on the three paths."""
    bad = rows.filter(differs)
    if not bad.height:
        return ""
    got = bad.row(0, named=True)
    want = definition.filter(pl.col(_ROW) == got[_ROW]).row(0, named=True)
    recomputed = warehouse.filter(pl.col(_ROW) == got[_ROW]).row(0, named=True)
    wrong = next(
        (c for c in columns if not (_same_value(got[c], want[c]) and _same_value(got[c], recomputed[c]))), columns[0]
    )
    where = {k: str(got[k]) for k in keys if k != _ROW}
    return f"{where} {wrong}: path={got[wrong]} definition={want[wrong]} warehouse={recomputed[wrong]}"


def _differs(left: pl.DataFrame, right: pl.DataFrame, columns: list[str]) -> pl.Series:
    joined = left.select(_ROW, *columns).join(right.select(_ROW, *columns), on=_ROW, suffix="__r").sort(_ROW)
    result = pl.Series([False] * joined.height)
    for c in columns:
        pairs = zip(joined[c].to_list(), joined[f"{c}__r"].to_list())
        result = result | pl.Series([not _same_value(a, b) for a, b in pairs])
    return result


def _same_value(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) <= 1e-9 * max(abs(float(b)), 1.0)
    return list(a) == list(b) if isinstance(a, list) else a == b


def _null_rate(frame: pl.DataFrame, column: str) -> float:
    return frame.get_column(column).null_count() / frame.height if frame.height else 0.0


# --- the independent recomputation ---------------------------------------------------------------
def warehouse_features(
    lake_root: Path | str,
    features: list[str],
    entities: pl.DataFrame,
    timing: Timing = LIVE_TIMING,
    catalogue: Catalogue = default_catalogue,
) -> pl.DataFrame:
    """The same values as features_as_of, computed from warehouse partitions with the views' polars
    plans: daily views at the midnight that started T's day, dimension views from every delivery before
    T's day, streaming views at the window end the live job had published at T."""
    lake = Lake(Path(lake_root))
    frame = entities.with_columns(pl.col(TIMESTAMP).cast(POLARS_TYPES["timestamp"]))
    by_view: dict[str, list[str]] = {}
    for f in features:
        ref = FeatureRef.parse(f)
        by_view.setdefault(ref.view, []).append(ref.feature)
    for name, wanted in by_view.items():
        view = catalogue.view(name)
        frame = frame.with_columns(_end_of(view, timing).alias("_end"))
        values = [
            _rows_at(lake, view, end).with_columns(pl.lit(end).cast(POLARS_TYPES["timestamp"]).alias("_end"))
            for end in sorted(set(frame.get_column("_end").drop_nulls().to_list()))
        ]
        if values:
            table = pl.concat(values).select(
                *view.join_keys, "_end", *[pl.col(f).alias(f"{name}__{f}") for f in wanted]
            )
            frame = frame.join(table, on=[*view.join_keys, "_end"], how="left")
        if view_kind(view) == ViewKind.STREAMING:
            days = lake.partition_days("warehouse", view.source.name)
            after_first = pl.col("_end") > day_end(days[0] - timedelta(days=1)) if days else pl.lit(False)
            frame = frame.with_columns(_zero_if_absent(view, wanted, after_first))
        for f in wanted:
            if f"{name}__{f}" not in frame.columns:
                frame = frame.with_columns(
                    pl.lit(None, POLARS_TYPES[view.dtype_of(_feature(view, f))]).alias(f"{name}__{f}")
                )
        frame = frame.drop("_end")
    return frame


def _end_of(view: FeatureView, timing: Timing) -> pl.Expr:
    ts = pl.col(TIMESTAMP)
    if view_kind(view) == ViewKind.STREAMING:
        return (ts - pl.duration(seconds=timing.streaming_delay_seconds)).dt.truncate(f"{timing.slide_seconds}s")
    return ts.dt.truncate("1d")  # daily rows and dimension deliveries are known from midnight on


def _rows_at(lake: Lake, view: FeatureView, end: datetime) -> pl.DataFrame:
    days = lake.partition_days("warehouse", view.source.name)
    if view.is_table_view:
        delivered = [d for d in days if day_end(d) <= end]
        if not delivered:
            return pl.DataFrame(schema=output_schema(view))
        changes = pl.concat(
            [
                lake.read_partition("warehouse", view.source.name, d).with_columns(pl.lit(d).alias("_delivered"))
                for d in delivered
            ]
        )
        ts = view.source.timestamp_field
        newest = changes.sort(ts, "_delivered").unique([view.source_column(k) for k in view.join_keys], keep="last")
        return build_table_rows(view, newest.drop("_delivered").lazy()).collect()
    start = (end - lookback(view)).date()
    needed = [d for d in days if start <= d < _date_of_end(end)]
    if not needed:
        return pl.DataFrame(schema=output_schema(view))
    events = pl.concat([lake.read_partition("warehouse", view.source.name, d) for d in needed]).lazy()
    return build_rows_at(view, events, end).collect()


def _date_of_end(end: datetime) -> date:
    return (end - timedelta(microseconds=1)).date() + timedelta(days=1)


def _zero_if_absent(view: FeatureView, wanted: list[str], after_first: pl.Expr) -> list[pl.Expr]:
    """No result in a window after the source's first day: no events, so counts 0 and lists empty."""
    out = []
    for f in wanted:
        feature, column = _feature(view, f), f"{view.name}__{f}"
        kind = feature.spec.kind if isinstance(feature.spec, Aggregation) else None
        dtype = POLARS_TYPES[view.dtype_of(feature)]
        if kind in ("count", "distinct_count", "sum"):
            empty = pl.lit(0).cast(dtype)
        elif kind == "last_n":
            empty = pl.lit([], dtype)
        else:
            continue
        out.append(pl.when(pl.col(column).is_null() & after_first).then(empty).otherwise(pl.col(column)).alias(column))
    return out


def _feature(view: FeatureView, name: str):
    return next(f for f in view.features if f.name == name)


# --- the online store: the definition "now" ---------------------------------------------------------
def online_skew(
    store, lake_root: Path | str, day: date, sample: int = 50, seed: int = 0, catalogue: Catalogue = default_catalogue
) -> list[ViewSkew]:
    """The batch-owned views online (`store`: a FeatureStoreEngine) against the definition and the
    warehouse as of the end of `day`, for a sample of the entities that have a row then."""
    lake, at = Lake(Path(lake_root)), day_end(day)
    out = []
    for view in catalogue.views:
        if view.streaming:
            continue  # the streaming path's: see streaming_regressions
        if view.is_table_view:
            entities = dimension_versions(lake, view, day).select(view.join_keys).unique()
        else:
            entities = lake.read_partition("offline", view.name, day).select(view.join_keys)
        entities = sample_rows(entities.sort(view.join_keys), sample, seed)
        found = store.online_view(view.name, entities.to_dicts(), view.feature_names)
        schema = {f"{view.name}__{f.name}": POLARS_TYPES[view.dtype_of(f)] for f in view.features}
        values = pl.DataFrame([{f"{view.name}__{k}": v for k, v in row.items()} for _, row in found], schema=schema)
        path = pl.concat([entities, values], how="horizontal").with_columns(
            pl.lit(at).cast(POLARS_TYPES["timestamp"]).alias(TIMESTAMP)
        )
        out += skew(lake_root, path, list(schema), catalogue=catalogue)
    return out


def streaming_snapshot(
    store, lake_root: Path | str, day: date, sample: int = 50, seed: int = 0, catalogue: Catalogue = default_catalogue
) -> dict[str, tuple[list[dict], list]]:
    """For a sample of each streaming view's entities with a row on `day`: their online timestamps."""
    lake, out = Lake(Path(lake_root)), {}
    for view in catalogue.views:
        if view.streaming and day in lake.partition_days("offline", view.name):
            entities = sample_rows(
                lake.read_partition("offline", view.name, day).select(view.join_keys).sort(view.join_keys), sample, seed
            ).to_dicts()
            out[view.name] = (entities, store.online_timestamps(view.name, entities))
    return out


def streaming_regressions(store, before: dict[str, tuple[list[dict], list]]) -> dict[str, int]:
    """Per streaming view: sampled entities whose online value is now older than before (a batch
    write replaced a newer streaming value) or gone."""
    out = {}
    for view, (entities, stamps) in before.items():
        now = store.online_timestamps(view, entities)
        out[view] = sum(1 for b, a in zip(stamps, now) if b is not None and (a is None or a < b))
    return out
