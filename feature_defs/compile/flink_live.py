"""Live rows of a streaming view over a trailing window: a row per entity and millisecond t with
events, the view over the entity's events in (t - window, t], its value at window_end t + 1 ms
(Flink keeps times to the millisecond), emitted once the watermark passes t. Counts and last_n come
from our LiveWindowFunction (jobs/flink/connectors), whose work per event does not grow with the
window; other kinds from Flink's OVER aggregation, whose operator walks the entity's whole window
at every row it emits."""

from __future__ import annotations

from feature_defs.compile.flink_sql import (
    LIST_ELEMENT,
    FlinkCompileError,
    aggregate_sql,
    insert_outputs,
    interval,
    qualifying,
)
from feature_defs.compile.streaming import StreamingPlan, WindowedAggregate

LIVE_SUFFIX = "__live"  # the sink folder of a view's live rows: {view}__live
LIVE_FUNCTION = "mlplane_live_window"  # jobs/flink/connectors: LiveWindowFunction
LIVE_FUNCTION_DDL = (
    f"CREATE TEMPORARY SYSTEM FUNCTION IF NOT EXISTS `{LIVE_FUNCTION}` "
    "AS 'mlplane.flink.LiveWindowFunction' LANGUAGE JAVA"
)
LIVE_KINDS = {"count", "last_n"}  # what LiveWindowFunction computes; other views' live rows use OVER


def live_insert(sink: str, events: str, plan: StreamingPlan) -> tuple[list[str], str]:
    """DDL and the insert of a view's live rows: a row per entity and millisecond t with events, the
    view over the entity's events in (t - window, t], its value at window_end t + 1 ms (Flink keeps
    times to the millisecond), emitted once the watermark passes t."""
    (window,) = {a.window_seconds for a in plan.aggregates}
    if {a.kind for a in plan.aggregates} <= LIVE_KINDS:
        return _live_function_insert(sink, events, plan, window)
    ts = f"`{plan.event_time}`"
    keys = ", ".join(f"`{c}` AS `{k}`" for k, c in plan.keys.items())
    partition = ", ".join(f"`{c}`" for c in plan.keys.values())
    aggs = "".join(f", {_over_aggregate_sql(a, plan)} AS `{a.feature}`" for a in plan.aggregates)
    rows = (
        f"SELECT {keys}, {ts} + INTERVAL '0.001' SECOND AS window_end{aggs} FROM `{events}` "
        f"WINDOW w AS (PARTITION BY {partition} ORDER BY {ts} "
        f"RANGE BETWEEN {interval(window - 0.001)} PRECEDING AND CURRENT ROW)"
    )
    return [], insert_outputs(sink, plan, rows)


def _over_aggregate_sql(agg: WindowedAggregate, plan: StreamingPlan) -> str:
    if agg.kind != "last_n":
        return aggregate_sql(agg, plan, over=" OVER w")
    # the window's values in time order, newest first, each at its most recent time, n of them
    value = qualifying(agg, agg.value_sql)
    # nulls (the events the filter leaves out) are not kept: state and work per event follow the
    # window's qualifying events, not all of its events
    values = f"ARRAY_AGG({value} IGNORE NULLS) OVER w"
    return f"ARRAY_SLICE(ARRAY_DISTINCT(ARRAY_REVERSE({values})), 1, {int(agg.n)})"


def _live_function_insert(sink: str, events: str, plan: StreamingPlan, window: int) -> tuple[list[str], str]:
    """Counts and last_n through our LiveWindowFunction, whose work per event does not grow with
    the window (Flink's OVER operator walks the entity's whole window at every row it emits)."""
    counts = [a for a in plan.aggregates if a.kind == "count"]
    last_n = [a for a in plan.aggregates if a.kind == "last_n"]
    if len(counts) > 63 or len(last_n) > 1:
        raise FlinkCompileError(f"feature view {plan.view!r}: live rows take at most 63 counts and one last_n")
    bits = " + ".join(
        f"(CASE WHEN {a.where_sql} THEN {1 << i} ELSE 0 END)" if a.where_sql else str(1 << i)
        for i, a in enumerate(counts)
    )
    listed, numeric = "CAST(NULL AS STRING)", "FALSE"
    if last_n:
        agg = last_n[0]
        listed = f"CAST({qualifying(agg, agg.value_sql)} AS STRING)"
        numeric = "TRUE" if plan.output_types[agg.feature] == "int64_list" else "FALSE"
    keys = ", ".join(f"`{c}` AS `{k}`" for k, c in plan.keys.items())
    source = f"{sink}__input"
    ddl = (
        f"CREATE TEMPORARY VIEW `{source}` AS SELECT {keys}, `{plan.event_time}`, "
        f"CAST({bits or '0'} AS BIGINT) AS counted, {listed} AS listed FROM `{events}`"
    )
    names = ", ".join(f"`{k}`" for k in plan.keys)
    features = "".join(f", counts[{i + 1}] AS `{a.feature}`" for i, a in enumerate(counts))
    if last_n:
        element = LIST_ELEMENT[plan.output_types[last_n[0].feature]]
        features += f", CAST(latest AS ARRAY<{element}>) AS `{last_n[0].feature}`"
    rows = (
        f"SELECT {names}, window_end{features} FROM TABLE(`{LIVE_FUNCTION}`(input => TABLE `{source}` "
        f"PARTITION BY {names}, on_time => DESCRIPTOR(`{plan.event_time}`), "
        f"window_millis => CAST({window * 1000} AS BIGINT), counts => {len(counts)}, "
        f"n => {int(last_n[0].n) if last_n else 0}, numeric_values => {numeric}, "
        f"uid => '{plan.view}{LIVE_SUFFIX}'))"
    )
    return [ddl], insert_outputs(sink, plan, rows)
