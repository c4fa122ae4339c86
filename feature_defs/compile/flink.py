"""Compile the streaming plans of one event source to a Flink SQL job (a JSON-able spec).

The job reads raw JSON lines (a directory the simulator appends to, through our ordered-files
connector, which hands over each line's fields as text; or a Kafka topic, whose lines the SQL
parses with JSON_VALUE), types and checks them in SQL, counts malformed and late lines, and
computes every streaming view over the source with event-time HOP windows (size = the feature's
window, slide = how often values are emitted; slide == size gives tumbling windows), or CUMULATE
windows for running aggregations (the period = the feature's window, emitted every slide). Each
window result is a complete value for (entity, window_end), written to a sink that the pusher
applies to the online store as an idempotent upsert. The same statements run in batch mode for backfills.

With `live_rows`, views over a trailing window also emit a row per entity and millisecond with
events (flink_live.py). Window-end rows still come at every slide: they carry the values of
entities whose events age out, and the empty values of those without any.

Semantics match the polars plan: a window ending at T covers events in [T - window, T); rows
with a null entity key are skipped; `where` filters treat null as false; sums of nothing are 0,
means and maxima of nothing are null; last_n keeps distinct values, most recent first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from feature_defs.compile.flink_live import LIVE_FUNCTION_DDL, LIVE_SUFFIX, live_insert
from feature_defs.compile.flink_sql import (
    LIST_ELEMENT,
    SQL_TYPES,
    WINDOW_END,
    FlinkCompileError,
    aggregate_sql,
    insert_outputs,
    interval,
)
from feature_defs.compile.streaming import StreamingPlan, WindowedAggregate

METRICS = "_metrics"  # the sink folder of the job's own counts


@dataclass(frozen=True)
class SourceOptions:
    """Where the raw event lines come from: a directory of JSON-lines files, or a Kafka topic."""

    kind: Literal["files", "kafka"] = "files"
    path: str = ""  # files: the directory the producer appends files to
    monitor_seconds: float = 1.0  # files: how often the directory is scanned (streaming mode)
    bootstrap_servers: str = ""  # kafka
    topic: str = ""  # kafka
    group_id: str = "mlplane-streaming-features"  # kafka

    @property
    def fields_extracted(self) -> bool:
        """The source hands over each top-level field of a line as text (our ordered-files
        connector parses a line once); otherwise the SQL reads them from the raw line with
        JSON_VALUE, which parses the line again for each field."""
        return self.kind == "files"

    def with_clause(self, mode: str) -> str:
        if self.kind == "files":
            if not self.path:
                raise FlinkCompileError("a files source needs a path")
            # our connector (jobs/flink/connectors): files in arrival order, each line parsed once
            options = {"connector": "ordered-files", "path": self.path}
            if mode == "streaming":  # keep watching for new files; a batch job reads what is there
                options["source.monitor-interval"] = f"{int(self.monitor_seconds * 1000)}ms"
        elif self.kind == "kafka":
            if not (self.bootstrap_servers and self.topic):
                raise FlinkCompileError("a kafka source needs bootstrap_servers and topic")
            options = {
                "connector": "kafka",
                "topic": self.topic,
                "format": "raw",
                "properties.bootstrap.servers": self.bootstrap_servers,
                "properties.group.id": self.group_id,
                "scan.startup.mode": "group-offsets",
                "properties.auto.offset.reset": "earliest",
            }
        else:
            raise FlinkCompileError(f"source kind must be 'files' or 'kafka', not {self.kind!r}")
        return _with(options)


@dataclass(frozen=True)
class ViewSink:
    """Where a view's window results land and how the pusher applies them to the online store."""

    keys: list[str]  # the entity's join keys
    features: dict[str, str]  # feature -> dtype, in the order of the view's output
    push_source: str  # the Feast PushSource of the view
    sink: str  # the folder Flink's filesystem sink commits window-end rows to
    empty: dict  # each feature's value over a window without events
    live: str | None = None  # the folder of the per-event rows, for views over a trailing window


@dataclass(frozen=True)
class FlinkJobSpec:
    """Everything the generic job body (jobs/flink/run_job.py) needs: SQL and settings, no code."""

    name: str
    mode: Literal["streaming", "batch"]
    statements: list[str]  # DDL, run in order
    inserts: list[str]  # one statement set, one Flink job
    views: dict[str, ViewSink]
    sink_root: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> FlinkJobSpec:
        return cls(**{**data, "views": {name: ViewSink(**view) for name, view in data["views"].items()}})


def flink_job(
    name: str,
    plans: list[StreamingPlan],
    source: SourceOptions,
    sink_root: str,
    mode: Literal["streaming", "batch"] = "streaming",
    slide_seconds: int = 60,
    watermark_delay_seconds: float = 5,
    roll_ms: int = 1000,
    live_rows: bool = False,
) -> FlinkJobSpec:
    """One Flink job computing every plan (all over the same event source)."""
    if not plans:
        raise FlinkCompileError(f"job {name!r}: no streaming plans")
    sources = {p.source for p in plans}
    if len(sources) != 1:
        raise FlinkCompileError(f"job {name!r}: plans read different sources {sorted(sources)}; one job per source")
    if mode not in ("streaming", "batch"):
        raise FlinkCompileError(f"job {name!r}: mode must be 'streaming' or 'batch', not {mode!r}")
    if slide_seconds <= 0 or watermark_delay_seconds < 0:
        raise FlinkCompileError(f"job {name!r}: slide must be positive and the watermark delay not negative")
    first = plans[0]
    raw, events = f"{first.source}_raw", f"{first.source}_events"
    keys = sorted({c for p in plans for c in p.keys.values()})
    statements = [
        _source_ddl(raw, first, source, mode, watermark_delay_seconds),
        _parsed_view(f"{first.source}_parsed", raw, first, keys, mode, _Line(source.fields_extracted)),
        f"CREATE TEMPORARY VIEW `{events}` AS SELECT * FROM `{first.source}_parsed` WHERE is_valid AND NOT is_late",
        _metrics_sink_ddl(sink_root, mode, roll_ms),
    ]
    inserts = [_metrics_insert(f"{first.source}_parsed", first.event_time, mode)]
    views = {}
    for plan in plans:
        sink = f"sink__{plan.view}"
        statements.append(_view_sink_ddl(sink, plan, f"{sink_root}/{plan.view}", mode, roll_ms))
        inserts.append(_view_insert(sink, events, plan, slide_seconds))
        live = None
        if live_rows and mode == "streaming" and not any(a.running for a in plan.aggregates):
            live = f"{sink_root}/{plan.view}{LIVE_SUFFIX}"
            statements.append(_view_sink_ddl(f"{sink}{LIVE_SUFFIX}", plan, live, mode, roll_ms))
            ddl, insert = live_insert(f"{sink}{LIVE_SUFFIX}", events, plan)
            statements += ([LIVE_FUNCTION_DDL] if ddl and LIVE_FUNCTION_DDL not in statements else []) + ddl
            inserts.append(insert)
        views[plan.view] = ViewSink(
            keys=list(plan.keys),
            features=dict(plan.output_types),
            push_source=plan.push_source,
            sink=f"{sink_root}/{plan.view}",
            empty=empty_values(plan),
            live=live,
        )
    return FlinkJobSpec(name=name, mode=mode, statements=statements, inserts=inserts, views=views, sink_root=sink_root)


# --- source -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Line:
    """How the SQL reads a raw line's fields: columns the source extracted, or JSON_VALUE."""

    extracted: bool

    def text(self, column: str) -> str:
        """The field's text as JSON_VALUE gives it: NULL when missing, null or not a scalar."""
        return f"`$.{column}`" if self.extracted else f"JSON_VALUE(line, '$.{column}')"

    def is_object(self) -> str:
        return "is_json_object" if self.extracted else "(line IS JSON OBJECT)"

    def physical_columns(self, schema: dict[str, str]) -> list[str]:
        if not self.extracted:
            return ["line STRING"]
        # the source reads a timestamp's text itself, as _timestamp_of does
        return ["is_json_object BOOLEAN"] + [
            f"`$.{c}` {'TIMESTAMP(3)' if t == 'timestamp' else 'STRING'}" for c, t in schema.items()
        ]

    def typed(self, column: str, dtype: str) -> str:
        if dtype == "timestamp":
            return f"`$.{column}`" if self.extracted else _timestamp_of(self.text(column))
        if dtype not in SQL_TYPES:
            raise FlinkCompileError(f"column {column!r}: type {dtype} is not supported in streaming sources")
        if dtype == "string":
            return self.text(column)
        return f"TRY_CAST({self.text(column)} AS {SQL_TYPES[dtype]})"


def _timestamp_of(text: str) -> str:
    """ISO-8601 text to a UTC TIMESTAMP(3), as polars parses it (engines.data.ingest): 'T' or a space,
    optional fractional seconds, and 'Z', a UTC offset ('+02:00', '-0530') or none (UTC). Fractions
    are cut to milliseconds, Flink's time precision, so that an event just before a window end never
    rounds up into the next window. Anything else is NULL (malformed), an impossible date, time or
    offset included: Flink's cast moves February 30 to the 28th and 24:00 to the next day, so the
    cast's text must give back the text it was cast from. Our file source reads the same text the
    same way in Java (jobs/flink/connectors, LineRowFormat.instant); Kafka sources use this."""
    iso = f"REPLACE({text}, 'T', ' ')"
    zones = r"(Z|[+-]([01]\d|2[0-3]):?[0-5]\d)?"
    valid = rf"REGEXP({iso}, '^\d{{4}}-\d{{2}}-\d{{2}} \d{{2}}:\d{{2}}:\d{{2}}(\.\d+)?{zones}$')"
    millis = rf"RPAD(COALESCE(REGEXP_EXTRACT({iso}, '^.{{19}}\.(\d{{1,3}})', 1), ''), 3, '0')"
    local = f"TRY_CAST(SUBSTRING({iso} FROM 1 FOR 19) || '.' || {millis} AS TIMESTAMP(3))"
    possible = f"SUBSTRING(CAST({local} AS STRING) FROM 1 FOR 19) = SUBSTRING({iso} FROM 1 FOR 19)"
    zone = rf"REPLACE(REGEXP_EXTRACT({iso}, '[+-]\d{{2}}:?\d{{2}}$', 0), ':', '')"  # '+0200', or NULL
    hours, minutes = f"CAST(SUBSTRING({zone} FROM 2 FOR 2) AS INT)", f"CAST(SUBSTRING({zone} FROM 4 FOR 2) AS INT)"
    sign = f"(CASE WHEN SUBSTRING({zone} FROM 1 FOR 1) = '-' THEN -1 ELSE 1 END)"
    offset = f"COALESCE({sign} * ({hours} * 3600 + {minutes} * 60), 0)"
    utc = f"TIMESTAMPADD(SECOND, -{offset}, {local})"
    return f"(CASE WHEN {valid} AND {possible} AND YEAR({utc}) BETWEEN 1 AND 9999 THEN {utc} END)"


def _source_ddl(table: str, plan: StreamingPlan, source: SourceOptions, mode: str, delay: float) -> str:
    ts, line = plan.event_time, _Line(source.fields_extracted)
    # A line without a readable timestamp gets the epoch (never null, which would fail the window
    # operator); the parsed view marks it malformed and no window sees it.
    columns = line.physical_columns(plan.source_schema) + [
        f"`{ts}` AS COALESCE({line.typed(ts, 'timestamp')}, TIMESTAMP '1970-01-01 00:00:00')",
    ]
    if mode == "streaming":
        columns += ["proc_time AS PROCTIME()", f"WATERMARK FOR `{ts}` AS `{ts}` - {interval(delay)}"]
    return f"CREATE TABLE `{table}` (\n  " + ",\n  ".join(columns) + f"\n) {source.with_clause(mode)}"


def _parsed_view(name: str, raw: str, plan: StreamingPlan, keys: list[str], mode: str, line: _Line) -> str:
    ts = plan.event_time
    typed = {c: line.typed(c, t) for c, t in plan.source_schema.items() if c != ts}
    checks = [line.is_object(), f"({line.typed(ts, 'timestamp')} IS NOT NULL)"]
    checks += [f"({typed[k]} IS NOT NULL)" for k in keys]
    # a value present with the wrong type (say 'user-3' for a BIGINT) is malformed, not null
    checks += [
        f"({line.text(c)} IS NULL OR {expr} IS NOT NULL)"
        for c, expr in typed.items()
        if plan.source_schema[c] not in ("string",)
    ]
    is_valid = "COALESCE(" + " AND ".join(checks) + ", FALSE)"
    columns = [f"{expr} AS `{c}`" for c, expr in typed.items()]
    # at or behind the watermark: dropped here and counted, not silently by a window or by the live
    # rows (whose OVER aggregation or LiveWindowFunction has already emitted that time)
    if mode == "streaming":
        late, extra = f"COALESCE(`{ts}` <= CURRENT_WATERMARK(`{ts}`), FALSE)", ", proc_time"
    else:
        late, extra = "FALSE", ""
    return (
        f"CREATE TEMPORARY VIEW `{name}` AS SELECT `{ts}`{extra}, "
        + ", ".join(columns)
        + f", {is_valid} AS is_valid, {late} AS is_late FROM `{raw}`"
    )


# --- sinks ------------------------------------------------------------------------------------------
def _sink_with(path: str, mode: str, roll_ms: int) -> str:
    options = {"connector": "filesystem", "path": path, "format": "json"}
    if mode == "streaming":  # a file is closed every roll_ms; the next checkpoint commits it (makes it visible)
        roll = f"{roll_ms}ms"
        options |= {"sink.rolling-policy.rollover-interval": roll, "sink.rolling-policy.check-interval": roll}
    return _with(options)


def _sql_type(dtype: str) -> str:
    if dtype in LIST_ELEMENT:
        return f"ARRAY<{LIST_ELEMENT[dtype]}>"
    return SQL_TYPES[dtype]


def _view_sink_ddl(sink: str, plan: StreamingPlan, folder: str, mode: str, roll_ms: int) -> str:
    columns = [f"`{k}` {SQL_TYPES[plan.source_schema[c]]}" for k, c in plan.keys.items()]
    columns.append(f"`{WINDOW_END}` TIMESTAMP(3)")
    columns += [f"`{f}` {_sql_type(t)}" for f, t in plan.output_types.items()]
    with_clause = _sink_with(folder, mode, roll_ms)
    return f"CREATE TABLE `{sink}` (\n  " + ",\n  ".join(columns) + f"\n) {with_clause}"


def _metrics_sink_ddl(sink_root: str, mode: str, roll_ms: int) -> str:
    columns = [
        "measured_at TIMESTAMP(3)",
        "records BIGINT",
        "malformed BIGINT",
        "late BIGINT",
        "max_event_time TIMESTAMP(3)",
    ]
    with_clause = _sink_with(f"{sink_root}/{METRICS}", mode, roll_ms)
    return "CREATE TABLE `sink__metrics` (" + ", ".join(columns) + f") {with_clause}"


def _metrics_insert(parsed: str, ts: str, mode: str) -> str:
    counts = (
        "COUNT(*), COUNT(CASE WHEN NOT is_valid THEN 1 END), COUNT(CASE WHEN is_valid AND is_late THEN 1 END), "
        f"MAX(CASE WHEN is_valid THEN `{ts}` END)"
    )
    if mode == "batch":
        return f"INSERT INTO `sink__metrics` SELECT CAST(LOCALTIMESTAMP AS TIMESTAMP(3)), {counts} FROM `{parsed}`"
    return (
        f"INSERT INTO `sink__metrics` SELECT CAST(window_end AS TIMESTAMP(3)), {counts} "
        f"FROM TABLE(TUMBLE(TABLE `{parsed}`, DESCRIPTOR(proc_time), {interval(1)})) "
        "GROUP BY window_start, window_end"
    )


# --- windowed aggregates -------------------------------------------------------------------------
def _view_insert(sink: str, events: str, plan: StreamingPlan, slide: int) -> str:
    windows = {(a.window_seconds, a.running) for a in plan.aggregates}
    if len(windows) != 1:
        raise FlinkCompileError(
            f"feature view {plan.view!r}: a streaming view's aggregations must share one window "
            f"(found {sorted(f'{s}s' + (' running' if r else '') for s, r in windows)}); "
            "split it into one view per window"
        )
    window, running = windows.pop()
    step = min(slide, window)
    if window % slide and slide % window:
        raise FlinkCompileError(f"feature view {plan.view!r}: window {window}s is not a multiple of the slide {slide}s")
    time_column = f"DESCRIPTOR(`{plan.event_time}`)"
    tvf = (
        f"TABLE(CUMULATE(TABLE `{events}`, {time_column}, {interval(step)}, {interval(window)}))"
        if running
        else f"TABLE(HOP(TABLE `{events}`, {time_column}, {interval(step)}, {interval(window)}))"
    )
    last_n = [a for a in plan.aggregates if a.kind == "last_n"]
    if len(last_n) > 1:
        raise FlinkCompileError(f"feature view {plan.view!r}: at most one last_n feature per streaming view")
    keys = ", ".join(f"`{c}` AS `{k}`" for k, c in plan.keys.items())
    group = "window_start, window_end, " + ", ".join(f"`{c}`" for c in plan.keys.values())
    aggs = "".join(f", {aggregate_sql(a, plan)} AS `{a.feature}`" for a in plan.aggregates if a.kind != "last_n")
    rows = f"SELECT {keys}, window_start, window_end{aggs} FROM {tvf} GROUP BY {group}"
    if last_n:  # LEFT window join: an entity with events but none that qualify gets an empty list
        on = " AND ".join(f"m.`{k}` = l.`{k}`" for k in plan.keys)
        latest = _last_n_sql(last_n[0], plan, tvf)
        rows = (
            f"SELECT m.*, l.`{last_n[0].feature}` FROM ({rows}) m LEFT JOIN ({latest}) l "
            f"ON {on} AND m.window_start = l.window_start AND m.window_end = l.window_end"
        )
    return insert_outputs(sink, plan, rows)


def empty_values(plan: StreamingPlan) -> dict:
    """Each feature's value over a window without events, as the polars plan gives it: counts and
    sums 0, last_n an empty list, means, maxima, minima and ratios null."""
    zero = {"count": 0, "distinct_count": 0, "sum": 0, "last_n": []}
    kinds = {a.feature: a.kind for a in plan.aggregates}
    values = {f: zero.get(kinds.get(f)) for f in plan.output_types}
    return {f: float(v) if v == 0 and plan.output_types[f] == "float64" else v for f, v in values.items()}


def _last_n_sql(agg: WindowedAggregate, plan: StreamingPlan, tvf: str) -> str:
    """last_n in plain SQL: each value's latest time per window, a window Top-N over (time, value)
    descending, then the top n pivoted into an array (nulls, where fewer than n, removed)."""
    keys = ", ".join(f"`{c}` AS `{k}`" for k, c in plan.keys.items())
    names = ", ".join(f"`{k}`" for k in plan.keys)
    where = f"({agg.where_sql}) AND " if agg.where_sql else ""
    latest = (
        f"SELECT {keys}, window_start, window_end, {agg.value_sql} AS v, MAX(`{plan.event_time}`) AS t "
        f"FROM {tvf} WHERE {where}{agg.value_sql} IS NOT NULL "
        f"GROUP BY window_start, window_end, {', '.join(f'`{c}`' for c in plan.keys.values())}, {agg.value_sql}"
    )
    ranked = (
        f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, {names} "
        f"ORDER BY t DESC, v DESC) AS rn FROM ({latest})) WHERE rn <= {int(agg.n)}"
    )
    element = LIST_ELEMENT[plan.output_types[agg.feature]]
    slots = ", ".join(f"MAX(CASE WHEN rn = {i} THEN v END)" for i in range(1, int(agg.n) + 1))
    return (
        f"SELECT {names}, window_start, window_end, ARRAY_REMOVE(ARRAY[{slots}], CAST(NULL AS {element})) "
        f"AS `{agg.feature}` FROM ({ranked}) GROUP BY window_start, window_end, {names}"
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _with(options: dict[str, str]) -> str:
    return "WITH (" + ", ".join(f"{_quote(k)} = {_quote(str(v))}" for k, v in options.items()) + ")"
