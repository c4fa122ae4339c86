"""Feature F of entity E as of time T: the one definition every offline reader uses (training sets,
batch inference, experiment reports, the online server's skew check). Plain Python, no Dagster.

Public API (small on purpose; the online model server calls it for its skew check):

    features_as_of(lake_root, features, entities, timing=Timing()) -> AsOfResult
    item_embeddings_as_of(lake_root, entities) -> pl.DataFrame
    FeatureRef.parse("view__feature"), view_kind(view) -> ViewKind
    MissingPartitionError

`entities` holds the views' join keys and an `event_timestamp` column (UTC); the result's frame is
`entities` in the same order with one column `<view>__<feature>` per requested feature, and a
report per view (rows, nulls, rows read before any data existed, rows whose entity had no value).

The rules, one per kind of view, all stated in terms of what serving could have held at T:

- **Daily batch view** (windowed aggregations over events): the row of the last complete day before
  T, i.e. the offline row of day `T.date() - 1`, stamped at midnight. A day's row exists only after
  the day is over, so a value inside day D is never seen before D ended: no leakage of the
  impression's own day, and the same row the daily materialization puts online.
- **Dimension (table) view**: the newest row with `updated_at <= T` *among the rows the platform
  knew at T*. A dimension change reaches serving only with the daily run after the day it was
  delivered in (a change at 10:00 of D is online from midnight after D), so a row counts from the
  end of its delivery day (`known_at`), not from its `updated_at`: training never sees a catalogue
  change that serving could not have shown, and a late delivery does not rewrite the past. The
  read goes through `dimension_versions`, an SCD type 2 table over every delivery day up to T (the
  version in force from `known_at`); one day's change set is never read on its own, so "the
  catalogue" cannot be mistaken for the rows that changed that day. Same-`updated_at` conflicts
  resolve to the newest delivery.
- **Streaming view**: the newest window ending at or before `T - streaming_delay` at the live job's
  slide, from `streaming_history` (the live job's SQL run in batch over landing). A window result is
  online only once the watermark has passed its end and a checkpoint committed it, so at T serving
  holds at best the window ending `delay` earlier; using event time alone would let training see a
  window up to `delay` before serving did. An entity without a result in that window had no events
  in it: its counts are 0 and its lists empty (as the pusher writes online).
- **CLIP item embeddings**: the newest embedding of an earlier, complete embedding day (`known_at`
  at the end of the day whose items were embedded), for the same reason as dimensions.

Bad input: a read for a time before the source's first day gives nulls and is counted in the
report (`before_data`), never a silent zero. A missing partition inside the data's history raises
`MissingPartitionError`: a view that is silently null is the defect this module exists to prevent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from enum import StrEnum
from pathlib import Path

import polars as pl

from engines.data.lake import Lake
from feature_defs import catalogue as default_catalogue
from feature_defs.compile.polars import POLARS_TYPES, TIMESTAMP, day_end
from feature_defs.dsl import Aggregation, Catalogue, FeatureView

OFFLINE_ZONE = "offline"
HISTORY_ZONE = "streaming_history"
SLIDE_FILE = "slide_seconds.txt"  # in a streaming_history partition: the slide it was recorded at
KNOWN_AT = "known_at"
_AS_OF = "_as_of"  # the lookup time of a row for one view (a day end, a version time or a window end)
_ROW = "_row"


class MissingPartitionError(RuntimeError):
    """An upstream partition the definition needs does not exist (the message names it)."""


class ViewKind(StrEnum):
    DIMENSION = "dimension"
    DAILY = "daily"
    STREAMING = "streaming"


def view_kind(view: FeatureView) -> ViewKind:
    if view.is_table_view:
        return ViewKind.DIMENSION
    return ViewKind.STREAMING if view.streaming else ViewKind.DAILY


@dataclass(frozen=True)
class FeatureRef:
    view: str
    feature: str

    @classmethod
    def parse(cls, column: str) -> FeatureRef:
        view, sep, feature = column.partition("__")
        if not sep or not view or not feature:
            raise ValueError(f"feature reference {column!r} is not '<view>__<feature>'")
        return cls(view, feature)

    @property
    def column(self) -> str:
        return f"{self.view}__{self.feature}"


@dataclass(frozen=True)
class Timing:
    """How the live platform publishes values (the definition is what serving could hold)."""

    slide_seconds: int = 60  # the live streaming job's slide
    streaming_delay_seconds: int = 7  # watermark delay + checkpoint interval of the live job


LIVE_TIMING = Timing()  # the live job's defaults (FlinkResource)


@dataclass
class ViewReport:
    view: str
    kind: ViewKind
    rows: int
    nulls: int  # rows whose first requested feature is null
    before_data: int  # rows read at a time before the view's source had any data (nulls)
    no_value: int  # rows whose entity had no row at that time (daily / dimension views)

    @property
    def null_rate(self) -> float:
        return self.nulls / self.rows if self.rows else 0.0


@dataclass
class AsOfResult:
    frame: pl.DataFrame
    reports: list[ViewReport] = field(default_factory=list)

    def report_rows(self) -> list[dict]:
        return [
            {
                "view": r.view,
                "kind": str(r.kind),
                "rows": r.rows,
                "nulls": r.nulls,
                "null_rate": round(r.null_rate, 4),
                "before_data": r.before_data,
                "no_value": r.no_value,
            }
            for r in self.reports
        ]


def features_as_of(
    lake_root: Path | str,
    features: Sequence[str | FeatureRef],
    entities: pl.DataFrame,
    timing: Timing = LIVE_TIMING,
    catalogue: Catalogue = default_catalogue,
) -> AsOfResult:
    """The requested features (`<view>__<feature>`) of every row of `entities` as of the row's
    `event_timestamp`, by the rules in this module's docstring. Rows keep their order."""
    if TIMESTAMP not in entities.columns:
        raise ValueError(f"entities need an {TIMESTAMP!r} column (the time each row is read as of)")
    refs = [f if isinstance(f, FeatureRef) else FeatureRef.parse(f) for f in features]
    by_view: dict[str, list[str]] = {}
    for ref in refs:
        by_view.setdefault(ref.view, []).append(ref.feature)
    lake = Lake(Path(lake_root))
    frame = entities.with_columns(pl.col(TIMESTAMP).cast(POLARS_TYPES["timestamp"]), pl.int_range(pl.len()).alias(_ROW))
    reports = []
    for name, wanted in by_view.items():
        view = catalogue.view(name)
        unknown = sorted(set(wanted) - set(view.feature_names))
        if unknown:
            raise KeyError(f"feature view {name!r} has no feature(s) {', '.join(unknown)}")
        missing_keys = [k for k in view.join_keys if k not in frame.columns]
        if missing_keys:
            raise KeyError(f"entities lack the join key(s) {', '.join(missing_keys)} of view {name!r}")
        values, report = _view_as_of(lake, view, wanted, frame.select(_ROW, TIMESTAMP, *view.join_keys), timing)
        frame = frame.join(values, on=_ROW, how="left")
        reports.append(report)
    return AsOfResult(frame.sort(_ROW).drop(_ROW), reports)


def _view_as_of(
    lake: Lake, view: FeatureView, wanted: list[str], rows: pl.DataFrame, timing: Timing
) -> tuple[pl.DataFrame, ViewReport]:
    kind = view_kind(view)
    first = _first_day(lake, view)
    ts = pl.col(TIMESTAMP)
    if kind == ViewKind.DAILY:
        lookup = rows.with_columns((ts.dt.date() - timedelta(days=1)).alias("_day"))
        known = lookup.filter(pl.col("_day") >= first) if first else lookup.clear()
        table = _daily_rows(lake, view, sorted(set(known.get_column("_day").to_list())))
        joined = known.join(table, on=[*view.join_keys, "_day"], how="left")
    elif kind == ViewKind.DIMENSION:
        known = rows.filter(ts >= _midnight_after(first)) if first else rows.clear()
        through = (known.get_column(TIMESTAMP).max().date() - timedelta(days=1)) if known.height else None
        versions = dimension_versions(lake, view, through) if through else None
        joined = _join_versions(known, versions, view) if versions is not None else known
    else:
        lookup = rows.with_columns(_window_end(ts, timing).alias(_AS_OF))
        known = lookup.filter(pl.col(_AS_OF) > _midnight(first)) if first else lookup.clear()
        joined = _streaming_values(lake, view, known, timing)
    columns = {f: POLARS_TYPES[view.dtype_of(next(x for x in view.features if x.name == f))] for f in wanted}
    out = rows.select(_ROW).join(joined.select(_ROW, *[c for c in columns if c in joined.columns]), on=_ROW, how="left")
    out = out.select(
        _ROW,
        *[
            (pl.col(c).cast(t) if c in out.columns else pl.lit(None, t)).alias(f"{view.name}__{c}")
            for c, t in columns.items()
        ],
    )
    probe = pl.col(f"{view.name}__{wanted[0]}")
    no_value = joined.filter(pl.col(wanted[0]).is_null()).height if wanted[0] in joined.columns else joined.height
    report = ViewReport(
        view.name,
        kind,
        rows.height,
        out.filter(probe.is_null()).height,
        rows.height - known.height,
        no_value if kind != ViewKind.STREAMING else 0,
    )
    return out, report


# --- daily batch views ----------------------------------------------------------------------------
def _daily_rows(lake: Lake, view: FeatureView, days: list[date]) -> pl.DataFrame:
    frames = [_read(lake, OFFLINE_ZONE, view.name, d).with_columns(pl.lit(d).alias("_day")) for d in days]
    if not frames:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in view.join_keys}, "_day": pl.Date})
    return pl.concat(frames).drop(TIMESTAMP)


# --- dimension views: an SCD type 2 read path ------------------------------------------------------
def dimension_versions(lake: Lake, view: FeatureView, through: date) -> pl.DataFrame:
    """Every version of every entity of a dimension view known by the end of `through`: the view's
    columns, `event_timestamp` (the source's updated_at) and `known_at` (the end of the delivery day,
    from when the version is in force). A version delivered late with an older `updated_at` than the
    one already in force never takes effect. Needs every delivery day from the first to `through`."""
    if not view.is_table_view:
        raise ValueError(f"feature view {view.name!r} is not a dimension view")
    first = _first_day(lake, view)
    if first is None or through < first:
        return pl.DataFrame(
            schema={
                **{k: pl.Int64 for k in view.join_keys},
                TIMESTAMP: POLARS_TYPES["timestamp"],
                KNOWN_AT: POLARS_TYPES["timestamp"],
            }
        )
    days = [first + timedelta(days=n) for n in range((through - first).days + 1)]
    frames = [
        _read(lake, OFFLINE_ZONE, view.name, d).with_columns(
            pl.lit(day_end(d)).cast(POLARS_TYPES["timestamp"]).alias(KNOWN_AT)
        )
        for d in days
    ]
    keys = view.join_keys
    changes = pl.concat(frames).sort(KNOWN_AT, TIMESTAMP)
    # in force: a version whose updated_at is not older than every version delivered before it
    in_force = changes.filter(
        pl.col(TIMESTAMP) >= pl.col(TIMESTAMP).cum_max().shift(1).over(keys).fill_null(pl.col(TIMESTAMP))
    )
    return in_force.unique([*keys, KNOWN_AT], keep="last", maintain_order=True)


def _join_versions(rows: pl.DataFrame, versions: pl.DataFrame, view: FeatureView) -> pl.DataFrame:
    keys = view.join_keys
    left = rows.with_columns(pl.col(TIMESTAMP).alias(_AS_OF)).sort(_AS_OF)
    right = versions.drop(TIMESTAMP).rename({KNOWN_AT: _AS_OF}).sort(_AS_OF)
    return left.join_asof(right, on=_AS_OF, by=keys, strategy="backward", check_sortedness=False)


# --- streaming views ----------------------------------------------------------------------------
def _window_end(ts: pl.Expr, timing: Timing) -> pl.Expr:
    """The end of the newest window at the live slide that serving holds at `ts`."""
    return (ts - pl.duration(seconds=timing.streaming_delay_seconds)).dt.truncate(f"{timing.slide_seconds}s")


def _streaming_values(lake: Lake, view: FeatureView, rows: pl.DataFrame, timing: Timing) -> pl.DataFrame:
    # a day's history partition holds the windows ending after its midnight up to the next one
    with_day = rows.with_columns((pl.col(_AS_OF) - pl.duration(microseconds=1)).dt.date().alias("_day"))
    frames = []
    for day in sorted(set(with_day.get_column("_day").to_list())):
        history = _read(lake, HISTORY_ZONE, view.name, day)
        slide = history_slide(lake, view.name, day)
        if slide != timing.slide_seconds:
            raise MissingPartitionError(
                f"{HISTORY_ZONE}/{view.name}/date={day} was recorded at a {slide}s slide; the live job slides "
                f"every {timing.slide_seconds}s: re-run the backfill at the live slide"
            )
        frames.append(history.rename({TIMESTAMP: _AS_OF}).with_columns(pl.lit(True).alias("_found")))
    if not frames:
        return rows
    joined = with_day.join(pl.concat(frames), on=[*view.join_keys, _AS_OF], how="left")
    return joined.with_columns(_empty_where_absent(view, pl.col("_found").fill_null(False)))


def _empty_where_absent(view: FeatureView, found: pl.Expr) -> list[pl.Expr]:
    """An entity without a result in the window had no events there: counts and sums 0, lists empty."""
    zero = {"count": 0, "distinct_count": 0, "sum": 0}
    out = []
    for f in view.features:
        dtype = POLARS_TYPES[view.dtype_of(f)]
        kind = f.spec.kind if isinstance(f.spec, Aggregation) else None
        if kind in zero:
            out.append(pl.when(found).then(pl.col(f.name)).otherwise(pl.lit(0).cast(dtype)).alias(f.name))
        elif kind == "last_n":
            out.append(pl.when(found).then(pl.col(f.name)).otherwise(pl.lit([], dtype)).alias(f.name))
    return out


def history_slide(lake: Lake, view: str, day: date) -> int | None:
    path = lake.partition_path(HISTORY_ZONE, view, day).with_name(SLIDE_FILE)
    return int(path.read_text()) if path.exists() else None


def record_history_slide(lake: Lake, view: str, day: date, slide_seconds: int) -> None:
    """Written next to a streaming_history partition by its writer (the backfill)."""
    lake.partition_path(HISTORY_ZONE, view, day).with_name(SLIDE_FILE).write_text(f"{slide_seconds}\n")


# --- CLIP item embeddings -----------------------------------------------------------------------
def item_embeddings_as_of(lake_root: Path | str, entities: pl.DataFrame) -> pl.DataFrame:
    """`entities` (item_id, event_timestamp) with `item_embedding`: the image embedding of the newest
    embedding day completed at the row's time (null before an item's first embedding)."""
    from engines.retrieval.embeddings import EMBEDDINGS_ZONE, ITEMS_TABLE

    lake = Lake(Path(lake_root))
    days = lake.partition_days(EMBEDDINGS_ZONE, ITEMS_TABLE)
    frame = entities.with_columns(pl.col(TIMESTAMP).cast(POLARS_TYPES["timestamp"]), pl.int_range(pl.len()).alias(_ROW))
    if not days:
        return frame.drop(_ROW).with_columns(pl.lit(None, pl.List(pl.Float32)).alias("item_embedding"))
    versions = pl.concat(
        [
            lake.read_partition(EMBEDDINGS_ZONE, ITEMS_TABLE, d)
            .filter(pl.col("skip_reason").is_null())
            .select(
                "item_id",
                pl.col("image_embedding").alias("item_embedding"),
                pl.lit(day_end(d)).cast(POLARS_TYPES["timestamp"]).alias(_AS_OF),
            )
            for d in days
        ]
    ).sort(_AS_OF)
    joined = (
        frame.with_columns(pl.col(TIMESTAMP).alias(_AS_OF))
        .sort(_AS_OF)
        .join_asof(versions, on=_AS_OF, by="item_id", strategy="backward", check_sortedness=False)
    )
    return joined.sort(_ROW).drop(_ROW, _AS_OF)


# --- partitions --------------------------------------------------------------------------------
def _first_day(lake: Lake, view: FeatureView) -> date | None:
    """The source's first warehouse day: before it nothing existed (nulls, counted)."""
    days = lake.partition_days("warehouse", view.source.name)
    return days[0] if days else None


def _read(lake: Lake, zone: str, table: str, day: date) -> pl.DataFrame:
    try:
        return lake.read_partition(zone, table, day)
    except FileNotFoundError:
        raise MissingPartitionError(
            f"{zone}/{table}/date={day} is missing: materialize it before reading features as of a time that needs it"
        ) from None


def _midnight(day: date) -> datetime:
    return day_end(day - timedelta(days=1))


def _midnight_after(day: date) -> datetime:
    return day_end(day)
