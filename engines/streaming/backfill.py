"""The backfill: the streaming views' compiled SQL in Flink's batch mode over landing days (on the
local mini-cluster, or a session cluster in production), and its check against the polars plan's
offline tables."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import date, timedelta
from pathlib import Path

import polars as pl

from engines.streaming.cluster import make_job
from engines.streaming.job import SHORT_LIVED_JVM_OPTIONS, FlinkJob, StreamingJobSettings
from engines.streaming.sink import committed_files
from feature_defs import catalogue as default_catalogue
from feature_defs.compile.flink import WINDOW_END, SourceOptions
from feature_defs.compile.polars import TIMESTAMP, day_end, output_schema
from feature_defs.dsl import Catalogue, FeatureView

HISTORY_ZONE = "streaming_history"  # the lake zone of backfilled window results

# Up to this many staged lines a backfill runs with SHORT_LIVED_JVM_OPTIONS: the sizes measured faster so
# (docs/benchmarks.md, "Streaming backfill"); longer backfills keep the optimizing compiler
SHORT_BACKFILL_LINES = 200_000


def stage_landing(lake, source: str, days: list, out: Path, key: str | None = None) -> int:
    """The landing partitions of `days` as JSON-lines files in `out`, the backfill job's input
    (Flink's bundled formats read JSON, not Parquet). Re-deliveries of a `key` resolve as ingestion
    resolves them: the newest delivery wins, by arrival order (`Lake.landing_files_by_arrival`, then
    the line), so the history sees the warehouse's version of a corrected event. Unreadable lines
    pass through for the job to count."""
    import pyarrow.parquet as pq

    from engines.data.lake import to_jsonl

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = [(day, path) for day in days for path in lake.landing_files_by_arrival(source, day)]
    lines = [
        (to_jsonl(pq.read_table(path)) if path.suffix == ".parquet" else path.read_text()).splitlines()
        for _, path in files
    ]
    newest = {}  # identity -> (file, line) of its newest delivery
    for f, file_lines in enumerate(lines):
        for n, line in enumerate(file_lines):
            identity = _identity(line, key)
            if identity is not None:
                newest[identity] = (f, n)
    lines_written = 0
    for f, ((day, path), file_lines) in enumerate(zip(files, lines)):
        kept = [line for n, line in enumerate(file_lines) if newest.get(_identity(line, key), (f, n)) == (f, n)]
        (out / f"{day.isoformat()}-{path.stem}.jsonl").write_text("".join(line + "\n" for line in kept))
        lines_written += len(kept)
    return lines_written


def _identity(line: str, key: str | None):
    try:
        return json.loads(line).get(key) if key else None
    except (json.JSONDecodeError, AttributeError):
        return None


def backfill(
    settings: StreamingJobSettings, lake, days: list, catalogue: Catalogue = default_catalogue, timeout: float = 900.0
) -> tuple[FlinkJob, dict]:
    """The streaming views of `settings.source` over historical landing days, with the same compiled
    SQL in Flink's batch mode. The landed days before them, as far back as the longest window
    reaches, are staged too, so that the windows ending early on the first day are complete.
    Re-running the same days replaces the earlier output."""
    if not days:
        raise ValueError("backfill needs at least one day")
    run_dir = settings.state_dir / "backfill" / f"{min(days)}_{max(days)}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    source = next(s for s in catalogue.sources if s.name == settings.source)
    earlier = {min(days) - timedelta(days=k) for k in range(1, days_before(source.name, catalogue) + 1)}
    staged_days = sorted(set(days) | earlier & set(lake.landing_days(source.name)))
    staged = stage_landing(lake, settings.source, staged_days, run_dir / "input", key=source.key)
    # on the cluster settings.rest names, if any: its TaskManagers must read the staged folder
    staged_at = SourceOptions(path=str((run_dir / "input").resolve()))
    run = replace(settings, state_dir=run_dir, source_options=staged_at, jvm_options=backfill_jvm_options(staged))
    job = make_job(run, catalogue, mode="batch")
    job.run_to_end(timeout)
    return job, {
        "lines_staged": staged,
        "days_staged": len(staged_days),
        "jvm_options": run.jvm_options,
        **job.metrics(),
    }


def backfill_jvm_options(lines: int) -> str:
    """A backfill of few lines runs in a JVM of a minute or less: the first JIT tier only, as a short test job.
    Beyond that the optimizing compiler's work pays off over the run, so a long backfill keeps it."""
    return SHORT_LIVED_JVM_OPTIONS if lines <= SHORT_BACKFILL_LINES else ""


def days_before(source: str, catalogue: Catalogue = default_catalogue) -> int:
    """How many days before a day the windows ending on it reach back, over the source's streaming views."""
    reach = max(v.max_window for v in catalogue.views if v.streaming and v.source.name == source)
    return -(-reach // timedelta(days=1))


def window_rows(job: FlinkJob, view: FeatureView) -> pl.DataFrame:
    """A view's window results shaped like its offline table: keys, `event_timestamp` (the end of
    the window) and the features, typed; one row per entity and window."""
    schema = output_schema(view)
    files = committed_files(job.sink_root / view.name)
    if not files:
        return pl.DataFrame(schema=schema)
    # polars' JSON-lines reader: millions of window rows, where json.loads per line took a minute
    as_written = {WINDOW_END: pl.String(), **{c: t for c, t in schema.items() if c != TIMESTAMP}}
    frame = (
        pl.scan_ndjson(files, schema=as_written)
        .with_columns(pl.col(WINDOW_END).str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_zone="UTC").alias(TIMESTAMP))
        .collect()
    )
    # no qualifying values: an empty list, as offline and online (the pusher) have it
    typed = [
        pl.col(c).cast(t).fill_null(pl.lit([], dtype=t)) if isinstance(t, pl.List) else pl.col(c).cast(t)
        for c, t in schema.items()
    ]
    return frame.select(typed).sort([TIMESTAMP, *view.join_keys])


def rows_by_day(rows: pl.DataFrame, days: list[date]) -> dict[date, pl.DataFrame]:
    """Window rows per day: a day holds the windows ending after its midnight, up to and including
    the next one (the end of day D is the offline table's timestamp of D)."""
    ts = pl.col(TIMESTAMP)
    return {day: rows.filter((ts > day_end(day - timedelta(days=1))) & (ts <= day_end(day))) for day in days}


def differences_from_offline(
    view: FeatureView, windows: pl.DataFrame, offline: pl.DataFrame, limit: int = 20
) -> list[dict]:
    """Where a day's window rows ending at the end of the day disagree with the view's offline
    row of that day (the polars plan), up to `limit`. An entity missing from the windows had no
    events in them, so its offline counts must be zero."""
    keys, counts = view.join_keys, [f.name for f in view.features if view.dtype_of(f) == "int64"]
    at_end = windows.filter(pl.col(TIMESTAMP) == offline[TIMESTAMP].max()) if offline.height else windows.clear()
    differences = [
        {"entity": json.dumps(row), "feature": "(row)", "windows": "present", "offline": "missing"}
        for row in at_end.join(offline, on=keys, how="anti").select(keys).head(limit).to_dicts()
    ]
    for row in offline.join(at_end, on=keys, how="anti").filter(pl.sum_horizontal(counts) != 0).head(limit).to_dicts():
        differences.append(
            {
                "entity": json.dumps({k: row[k] for k in keys}),
                "feature": "(row)",
                "windows": "no events",
                "offline": json.dumps({c: row[c] for c in counts}),
            }
        )
    both = at_end.join(offline, on=keys, suffix="__offline")
    for feature in view.feature_names:
        got, want = pl.col(feature), pl.col(f"{feature}__offline")
        if both.schema[feature] == pl.Float64:
            same = (got - want).abs() <= 1e-9 * pl.max_horizontal(want.abs(), pl.lit(1.0))
        else:
            same = got == want
        unequal = both.filter(~same.fill_null(got.is_null() & want.is_null()))
        differences += [
            {
                "entity": json.dumps({k: r[k] for k in keys}),
                "feature": feature,
                "windows": str(r[feature]),
                "offline": str(r[f"{feature}__offline"]),
            }
            for r in unequal.head(limit).to_dicts()
        ]
    return differences[:limit]
