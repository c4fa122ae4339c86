"""Compile streaming feature views to an engine-neutral plan (JSON-able) that a streaming engine
executes: keyed sliding or running (cumulative) windows over an event stream, with filters and
values as SQL fragments, pushed to the view's Feast PushSource. The Flink job compiler consumes this plan."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from feature_defs.dsl import Aggregation, Catalogue, FeatureView, Ratio, format_window


@dataclass(frozen=True)
class WindowedAggregate:
    feature: str
    kind: str
    window: str  # like "1h"
    window_seconds: int
    value_sql: str | None
    where_sql: str | None
    n: int | None
    running: bool = False  # since the start of the current period (Flink CUMULATE), not trailing (HOP)


@dataclass(frozen=True)
class DerivedFeature:
    feature: str
    sql: str  # over the aggregate columns of the same row


@dataclass(frozen=True)
class StreamingPlan:
    view: str
    source: str
    source_schema: dict[str, str]
    event_time: str
    keys: dict[str, str]  # join key -> source column
    aggregates: list[WindowedAggregate]
    derived: list[DerivedFeature]
    push_source: str
    output_types: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def streaming_plan(view: FeatureView) -> StreamingPlan:
    if not view.streaming:
        raise ValueError(f"feature view {view.name!r} is not a streaming view")
    aggregates, derived = [], []
    for f in view.features:
        spec = f.spec
        if isinstance(spec, Aggregation):
            aggregates.append(
                WindowedAggregate(
                    feature=f.name,
                    kind=spec.kind,
                    window=format_window(spec.window_td),
                    window_seconds=int(spec.window_td.total_seconds()),
                    value_sql=spec.of.to_sql() if spec.of is not None else None,
                    where_sql=spec.where.to_sql() if spec.where is not None else None,
                    n=spec.n,
                    running=spec.running,
                )
            )
        elif isinstance(spec, Ratio):
            num, den = f"`{spec.numerator}`", f"`{spec.denominator}`"
            derived.append(
                DerivedFeature(f.name, f"CASE WHEN {den} > 0 THEN CAST({num} AS DOUBLE) / {den} ELSE NULL END")
            )
    return StreamingPlan(
        view=view.name,
        source=view.source.name,
        source_schema=dict(view.source.schema),
        event_time=view.source.timestamp_field,
        keys={k: view.source_column(k) for k in view.join_keys},
        aggregates=aggregates,
        derived=derived,
        push_source=view.push_source_name,
        output_types={f.name: view.dtype_of(f) for f in view.features},
    )


def streaming_plans(catalogue: Catalogue) -> list[StreamingPlan]:
    return [streaming_plan(v) for v in catalogue.views if v.streaming]
