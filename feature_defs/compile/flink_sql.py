"""SQL fragments shared by the Flink compiler's window-end and live-row statements."""

from __future__ import annotations

from feature_defs.compile.streaming import StreamingPlan, WindowedAggregate

SQL_TYPES = {"int64": "BIGINT", "float64": "DOUBLE", "string": "STRING", "bool": "BOOLEAN"}
LIST_ELEMENT = {"int64_list": "BIGINT", "string_list": "STRING"}
WINDOW_END = "window_end"  # the sink column with the end of the window (exclusive), UTC


class FlinkCompileError(ValueError):
    """A streaming plan that the Flink compiler cannot express; the message names the view."""


def insert_outputs(sink: str, plan: StreamingPlan, rows: str) -> str:
    derived = {d.feature: d.sql for d in plan.derived}
    outer = [f"`{k}`" for k in plan.keys] + [f"CAST(window_end AS TIMESTAMP(3)) AS `{WINDOW_END}`"]
    outer += [f"{derived[f]} AS `{f}`" if f in derived else f"`{f}`" for f in plan.output_types]
    return f"INSERT INTO `{sink}` SELECT {', '.join(outer)} FROM ({rows})"


def qualifying(agg: WindowedAggregate, value: str) -> str:
    """`value` where the aggregate's filter holds, else NULL (a NULL filter counts as false)."""
    return f"CASE WHEN {agg.where_sql} THEN {value} END" if agg.where_sql else value


def aggregate_sql(agg: WindowedAggregate, plan: StreamingPlan, over: str = "") -> str:
    """The aggregate of a window group; with `over` (" OVER w"), of an OVER window."""

    match agg.kind:
        case "count":
            return f"COUNT({qualifying(agg, '1')}){over}"
        case "sum":
            return f"COALESCE(SUM({qualifying(agg, agg.value_sql)}){over}, 0)"
        case "mean":
            return f"AVG(CAST({qualifying(agg, agg.value_sql)} AS DOUBLE)){over}"
        case "max":
            return f"MAX({qualifying(agg, agg.value_sql)}){over}"
        case "min":
            return f"MIN({qualifying(agg, agg.value_sql)}){over}"
        case "distinct_count":
            return f"COUNT(DISTINCT {qualifying(agg, agg.value_sql)}){over}"
    raise FlinkCompileError(f"feature view {plan.view!r}, feature {agg.feature!r}: {agg.kind} has no Flink form")


def interval(seconds: float) -> str:
    millis = round(seconds * 1000)
    days, rest = divmod(millis // 1000, 86400)
    clock = f"{days} {rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    if millis % 1000:
        return f"INTERVAL '{clock}.{millis % 1000:03d}' DAY(3) TO SECOND(3)"
    return f"INTERVAL '{clock}' DAY(3) TO SECOND"
