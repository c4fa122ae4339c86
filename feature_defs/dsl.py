"""The feature DSL: entities, sources, features, feature views and feature services.

Definitions are plain frozen dataclasses validated at construction, so a bad definition fails
when `feature_defs` is imported, with an error that names it. Compilers live in
`feature_defs.compile` (polars plans, Feast objects, streaming plans).

Semantics shared by every engine:
- An aggregation over `window` at time T covers source rows with timestamp in [T - window, T).
  A running aggregation (`running=True`, a running count or total) covers [P, T) instead, where P
  is the start of the `window`-long period that T closes or falls in; periods are aligned to the
  Unix epoch in UTC, so a '1d' running count restarts at midnight UTC (Flink's CUMULATE windows).
- Offline, a batch view has one row per entity per day, stamped at the end of the day (T =
  midnight UTC of the next day), for every entity seen within the view's longest window plus
  one day; that extra day writes zeros so an inactive entity does not keep stale values online.
- A table view (over a dimension) has one row per changed source row, stamped at its
  `timestamp_field`, and row-level transforms only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from feature_defs.expr import Col, Expr, col

# Logical column types. Compilers map them to polars, Feast and SQL types.
DType = Literal["int64", "float64", "string", "bool", "timestamp", "int64_list", "string_list"]
NUMERIC: frozenset[str] = frozenset({"int64", "float64"})


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # running periods are aligned to it


class FeatureDefinitionError(ValueError):
    """A feature definition is invalid. The message names the definition and the problem."""


_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_window(window: str | timedelta, where: str) -> timedelta:
    if isinstance(window, timedelta):
        return window
    m = _DURATION.match(window)
    if not m:
        raise FeatureDefinitionError(f"{where}: window {window!r} is not a duration like '30m', '1h' or '7d'")
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def format_window(window: timedelta) -> str:
    seconds = int(window.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Entity:
    name: str
    join_key: str
    dtype: DType = "int64"
    description: str = ""


@dataclass(frozen=True)
class Source:
    """A warehouse table that feature views read: an event stream or a dimension, ingested from landing,
    or a table mlplane computes itself (`produced_by`: the key of the asset writing it, '/'-separated).

    `kind="events"`: append-only rows, aggregated over windows.
    `kind="table"`: a dimension whose changes arrive daily, keyed by `key`.
    """

    name: str
    kind: Literal["events", "table"]
    timestamp_field: str
    schema: dict[str, DType]
    key: str | None = None
    description: str = ""
    produced_by: str | None = None

    def __post_init__(self) -> None:
        where = f"source {self.name!r}"
        if self.timestamp_field not in self.schema:
            raise FeatureDefinitionError(f"{where}: timestamp_field {self.timestamp_field!r} is not a column")
        if self.schema[self.timestamp_field] != "timestamp":
            raise FeatureDefinitionError(
                f"{where}: windows and point-in-time joins need a timestamp, but timestamp_field "
                f"{self.timestamp_field!r} is {self.schema[self.timestamp_field]}"
            )
        if self.kind == "table" and (self.key is None or self.key not in self.schema):
            raise FeatureDefinitionError(f"{where}: a table source needs a key column, got {self.key!r}")

    @property
    def columns(self) -> list[str]:
        return list(self.schema)


AggKind = Literal["count", "sum", "mean", "max", "min", "distinct_count", "last_n"]


@dataclass(frozen=True)
class Aggregation:
    """A windowed aggregation over an event source. Build with count(), sum_(), ..."""

    kind: AggKind
    window: str | timedelta
    of: Expr | None = None  # the aggregated value; None for count
    where: Expr | None = None  # rows that count
    n: int | None = None  # for last_n
    running: bool = False  # since the start of the current period, not over the trailing window

    @property
    def window_td(self) -> timedelta:
        return parse_window(self.window, "aggregation")

    def start(self, end: datetime) -> datetime:
        """The first instant the aggregation's value at `end` covers: its rows are in [start, end)."""
        if not self.running:
            return end - self.window_td
        periods = (end - EPOCH - timedelta(microseconds=1)) // self.window_td
        return EPOCH + periods * self.window_td


@dataclass(frozen=True)
class Ratio:
    """numerator / denominator of two features of the same view; null when the denominator is 0."""

    numerator: str
    denominator: str


@dataclass(frozen=True)
class Transform:
    """A row-level transform of a table source."""

    expr: Expr


# `running=True` makes any aggregation a running one: `count("1d", running=True)` counts since
# midnight UTC rather than over the last 24 hours.
def count(window: str, where: Expr | None = None, running: bool = False) -> Aggregation:
    return Aggregation("count", window, where=where, running=running)


def sum_(of: Expr | str, window: str, where: Expr | None = None, running: bool = False) -> Aggregation:
    return Aggregation("sum", window, of=_as_expr(of), where=where, running=running)


def mean(of: Expr | str, window: str, where: Expr | None = None, running: bool = False) -> Aggregation:
    return Aggregation("mean", window, of=_as_expr(of), where=where, running=running)


def max_(of: Expr | str, window: str, where: Expr | None = None, running: bool = False) -> Aggregation:
    return Aggregation("max", window, of=_as_expr(of), where=where, running=running)


def distinct_count(of: Expr | str, window: str, where: Expr | None = None, running: bool = False) -> Aggregation:
    return Aggregation("distinct_count", window, of=_as_expr(of), where=where, running=running)


def last_n(of: Expr | str, n: int, window: str, where: Expr | None = None, running: bool = False) -> Aggregation:
    """The last n distinct values, most recent first."""
    return Aggregation("last_n", window, of=_as_expr(of), where=where, n=n, running=running)


def ratio(numerator: str, denominator: str) -> Ratio:
    return Ratio(numerator, denominator)


def transform(expr: Expr | str) -> Transform:
    return Transform(_as_expr(expr))


def _as_expr(value: Expr | str) -> Expr:
    return col(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class Feature:
    name: str
    spec: Aggregation | Ratio | Transform
    description: str = ""


_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class FeatureView:
    """Features of one or more entities computed from one source.

    `entity_columns` maps an entity's join key to the source column holding it, when they differ
    (for example the `user_id` of an abuse report is its `reported_user_id`).
    `streaming=True` views also get a Feast PushSource and a streaming plan.
    """

    name: str
    entities: tuple[Entity, ...]
    source: Source
    features: tuple[Feature, ...]
    description: str = ""
    owner: str = "ml-platform@marketplace.example"
    entity_columns: dict[str, str] = field(default_factory=dict)
    streaming: bool = False
    tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entities", tuple(self.entities))
        object.__setattr__(self, "features", tuple(self.features))
        self._validate()

    # --- derived facts -------------------------------------------------------------------
    @property
    def join_keys(self) -> list[str]:
        return [e.join_key for e in self.entities]

    def source_column(self, join_key: str) -> str:
        return self.entity_columns.get(join_key, join_key)

    @property
    def is_table_view(self) -> bool:
        return self.source.kind == "table"

    @property
    def max_window(self) -> timedelta:
        windows = [f.spec.window_td for f in self.features if isinstance(f.spec, Aggregation)]
        return max(windows, default=timedelta(0))

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def push_source_name(self) -> str:
        """The Feast push source a streaming view's results arrive through."""
        return f"{self.name}_push"

    def dtype_of(self, feature: Feature) -> DType:
        spec = feature.spec
        if isinstance(spec, Ratio):
            return "float64"
        if isinstance(spec, Transform):
            return _infer_dtype(spec.expr, self.source.schema)
        if spec.kind in ("count", "distinct_count"):
            return "int64"
        if spec.kind == "mean":
            return "float64"
        value_type = _infer_dtype(spec.of, self.source.schema)
        if spec.kind == "last_n":
            return "string_list" if value_type == "string" else "int64_list"
        return value_type

    # --- validation ------------------------------------------------------------------------
    def _validate(self) -> None:
        where = f"feature view {self.name!r}"
        if not _NAME.match(self.name):
            raise FeatureDefinitionError(f"{where}: name must be snake_case")
        if not self.entities:
            raise FeatureDefinitionError(f"{where}: needs at least one entity")
        if not self.features:
            raise FeatureDefinitionError(f"{where}: has no features")
        schema = self.source.schema
        for e in self.entities:
            column = self.source_column(e.join_key)
            if column not in schema:
                raise FeatureDefinitionError(
                    f"{where}: entity {e.name!r} is keyed by column {column!r}, "
                    f"which source {self.source.name!r} does not have (columns: {', '.join(schema)})"
                )
        if self.is_table_view and self.streaming:
            raise FeatureDefinitionError(f"{where}: a table view cannot be streaming")
        seen: set[str] = set()
        for f in self.features:
            fwhere = f"{where}, feature {f.name!r}"
            if not _NAME.match(f.name):
                raise FeatureDefinitionError(f"{fwhere}: name must be snake_case")
            if f.name in seen:
                raise FeatureDefinitionError(f"{where}: duplicate feature name {f.name!r}")
            if f.name in self.join_keys or f.name in schema and not isinstance(f.spec, Transform):
                raise FeatureDefinitionError(f"{fwhere}: name collides with a source column or join key")
            seen.add(f.name)
            self._validate_spec(f, fwhere, seen)

    def _validate_spec(self, f: Feature, where: str, defined: set[str]) -> None:
        schema, spec = self.source.schema, f.spec
        if isinstance(spec, Ratio):
            for part in (spec.numerator, spec.denominator):
                if part not in defined or part == f.name:
                    raise FeatureDefinitionError(
                        f"{where}: ratio refers to {part!r}, which is not a feature defined earlier in this view"
                    )
            return
        if isinstance(spec, Transform):
            if not self.is_table_view:
                raise FeatureDefinitionError(
                    f"{where}: row-level transforms belong in a table view; use an aggregation"
                )
            _check_columns(spec.expr, schema, where, self.source.name)
            return
        if self.is_table_view:
            raise FeatureDefinitionError(f"{where}: aggregations need an event source, {self.source.name!r} is a table")
        window = parse_window(spec.window, where)
        if window <= timedelta(0):
            raise FeatureDefinitionError(f"{where}: window must be positive")
        for expr in (spec.of, spec.where):
            if expr is not None:
                _check_columns(expr, schema, where, self.source.name)
        if spec.kind == "count" and spec.of is not None:
            raise FeatureDefinitionError(f"{where}: count takes no value, use where= to filter")
        if spec.kind != "count" and spec.of is None:
            raise FeatureDefinitionError(f"{where}: {spec.kind} needs a value to aggregate")
        if spec.kind in ("sum", "mean") and _infer_dtype(spec.of, schema) not in NUMERIC:
            raise FeatureDefinitionError(f"{where}: {spec.kind} of a non-numeric value {spec.of!r}")
        if spec.kind == "last_n" and not (spec.n and spec.n > 0):
            raise FeatureDefinitionError(f"{where}: last_n needs n > 0")


@dataclass(frozen=True)
class FeatureService:
    """A named set of feature views that one model consumes (Feast FeatureService)."""

    name: str
    views: tuple[FeatureView, ...]
    description: str = ""
    owner: str = "ml-platform@marketplace.example"

    def __post_init__(self) -> None:
        object.__setattr__(self, "views", tuple(self.views))
        if not _NAME.match(self.name):
            raise FeatureDefinitionError(f"feature service {self.name!r}: name must be snake_case")
        if not self.views:
            raise FeatureDefinitionError(f"feature service {self.name!r}: has no feature views")


@dataclass(frozen=True)
class Catalogue:
    """Every definition, checked as a whole: unique names across views and services."""

    entities: tuple[Entity, ...]
    sources: tuple[Source, ...]
    views: tuple[FeatureView, ...]
    services: tuple[FeatureService, ...]

    def __post_init__(self) -> None:
        for kind, items in (
            ("entity", self.entities),
            ("source", self.sources),
            ("feature view", self.views),
            ("feature service", self.services),
        ):
            names = [i.name for i in items]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise FeatureDefinitionError(f"duplicate {kind} name(s): {', '.join(dupes)}")
        for service in self.services:
            for view in service.views:
                if view not in self.views:
                    raise FeatureDefinitionError(
                        f"feature service {service.name!r}: view {view.name!r} is not in the catalogue"
                    )

    def view(self, name: str) -> FeatureView:
        for v in self.views:
            if v.name == name:
                return v
        raise KeyError(f"no feature view named {name!r}; known: {', '.join(v.name for v in self.views)}")

    def service(self, name: str) -> FeatureService:
        for s in self.services:
            if s.name == name:
                return s
        raise KeyError(f"no feature service named {name!r}; known: {', '.join(s.name for s in self.services)}")

    @property
    def feature_count(self) -> int:
        return sum(len(v.features) for v in self.views)


def _check_columns(expr: Expr, schema: dict[str, DType], where: str, source: str) -> None:
    unknown = sorted(expr.columns() - set(schema))
    if unknown:
        raise FeatureDefinitionError(
            f"{where}: unknown column(s) {', '.join(map(repr, unknown))} in source {source!r} "
            f"(columns: {', '.join(schema)})"
        )


def _infer_dtype(expr: Expr | None, schema: dict[str, DType]) -> DType:
    """Result type of an expression, enough for Feast schemas and validation."""
    from feature_defs.expr import BinaryOp, Func, IsIn, Lit

    if isinstance(expr, Col):
        return schema[expr.name]
    if isinstance(expr, Lit):
        v = expr.value
        return (
            "bool"
            if isinstance(v, bool)
            else "int64"
            if isinstance(v, int)
            else ("float64" if isinstance(v, float) else "string")
        )
    if isinstance(expr, IsIn):
        return "bool"
    if isinstance(expr, BinaryOp):
        if expr.op in ("==", "!=", "<", "<=", ">", ">=", "&", "|"):
            return "bool"
        if expr.op == "/":
            return "float64"
        types = {_infer_dtype(expr.left, schema), _infer_dtype(expr.right, schema)}
        return "float64" if "float64" in types else "int64"
    if isinstance(expr, Func):
        if expr.name in ("not", "is_null", "is_not_null"):
            return "bool"
        if expr.name == "log1p":
            return "float64"
        if expr.name == "str_len":
            return "int64"
        return _infer_dtype(expr.args[0], schema)
    raise FeatureDefinitionError(f"cannot infer the type of {expr!r}")
