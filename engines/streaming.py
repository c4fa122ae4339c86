"""Streaming features: Flink jobs compiled from the DSL, their health, and the bridge that pushes
their results into the online store. Plain Python, no Dagster.

Flink runs in its own environment (.venv-flink, which cannot import Feast), so the bridge is a
directory: the job writes each window result (entity, window_end, features) as JSON lines with
Flink's filesystem sink, which commits files only when a checkpoint completes (exactly once);
`OnlinePusher` in the main environment applies committed files with Feast's push path
(`FeatureStore.push` to the view's PushSource), keeping per entity the newest window it pushed.
A window result is a complete value, not an increment, so a file applied twice, or a window
re-emitted after a restart from a checkpoint, never double-counts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import polars as pl

from feature_defs import catalogue as default_catalogue
from feature_defs.compile.flink import METRICS, WINDOW_END, FlinkJobSpec, SourceOptions, flink_job
from feature_defs.compile.polars import TIMESTAMP, day_end, output_schema
from feature_defs.compile.streaming import streaming_plan
from feature_defs.dsl import Catalogue, FeatureView

PROJECT_ROOT = Path(__file__).resolve().parents[1]
JOB_BODY = PROJECT_ROOT / "jobs" / "flink" / "run_job.py"
DEFAULT_FLINK_PYTHON = PROJECT_ROOT / ".venv-flink" / "bin" / "python"
HISTORY_ZONE = "streaming_history"  # the lake zone of backfilled window results
TOTALS_FILE = "_totals.json"  # in the metrics sink: the counts of metric files folded in and deleted
MIN_KEEP_SECONDS = 60  # result files are kept at least this long after their commit
PRUNE_EVERY_SECONDS = 60


class StreamingJobError(RuntimeError):
    """A streaming job failed or cannot start; the message says why and where its log is."""


def streaming_sources(catalogue: Catalogue = default_catalogue) -> list[str]:
    """Event sources with streaming views: one Flink job each."""
    return sorted({v.source.name for v in catalogue.views if v.streaming})


@dataclass(frozen=True)
class StreamingJobSettings:
    source: str  # the event source whose streaming views the job computes
    state_dir: Path  # spec, status, checkpoints, sink files, logs
    source_options: SourceOptions
    slide_seconds: int = 60  # how often each window emits; == window size gives tumbling windows
    watermark_delay_seconds: int = 5  # how late (event time) an event may arrive and still count
    checkpoint_interval_ms: int = 2000  # also how often results become visible
    flink_python: Path = DEFAULT_FLINK_PYTHON
    jvm_heap: str = "512m"

    @property
    def name(self) -> str:
        return f"streaming_features_{self.source}"


@dataclass
class JobHealth:
    name: str
    status: str  # RUNNING, FINISHED, FAILED, CANCELED, CREATED, ... or NOT_STARTED / DIED
    healthy: bool
    pid: int | None = None
    job_id: str | None = None
    checkpoint: str | None = None  # newest retained checkpoint
    checkpoint_age_seconds: float | None = None
    records: int = 0  # lines read
    malformed: int = 0  # lines dropped as unreadable (not JSON, bad timestamp, missing or mistyped key)
    late: int = 0  # events older than the watermark, dropped
    newest_event_time: str | None = None
    lag_seconds: float | None = None  # wall clock minus the newest event time the job has processed
    error: str | None = None
    log_dir: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class FlinkJob:
    """One streaming (or batch) job on the local mini-cluster, as a process of .venv-flink."""

    def __init__(self, settings: StreamingJobSettings, catalogue: Catalogue = default_catalogue,
                 mode: Literal["streaming", "batch"] = "streaming"):
        self.settings = settings
        self.catalogue = catalogue
        self.mode = mode
        self.state_dir = settings.state_dir
        self.sink_root = self.state_dir / "sink"
        self.status_path = self.state_dir / "status.json"
        self.log_dir = self.state_dir / "log"

    # --- definition --------------------------------------------------------------------------
    def spec(self) -> FlinkJobSpec:
        source = self.settings.source
        plans = [streaming_plan(v) for v in self.catalogue.views if v.streaming and v.source.name == source]
        if not plans:
            raise StreamingJobError(f"no streaming feature views read source {self.settings.source!r}")
        return flink_job(self.settings.name, plans, self.settings.source_options, str(self.sink_root.resolve()),
                         mode=self.mode, slide_seconds=self.settings.slide_seconds,
                         watermark_delay_seconds=self.settings.watermark_delay_seconds)

    def write_spec(self) -> Path:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / "spec.json"
        path.write_text(json.dumps(self.spec().to_dict(), indent=2))
        return path

    def command(self, restore: Path | None = None) -> list[str]:
        python = Path(self.settings.flink_python)
        if not python.exists():
            raise StreamingJobError(f"the Flink environment {python} is missing: run scripts/setup-flink")
        command = [str(python), str(JOB_BODY), str(self.write_spec()), "--state-dir", str(self.state_dir),
                   "--checkpoint-interval-ms", str(self.settings.checkpoint_interval_ms)]
        return command + (["--restore", str(restore)] if restore else [])

    def env(self) -> dict[str, str]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "JVM_ARGS": f"-Xmx{self.settings.jvm_heap}", "FLINK_LOG_DIR": str(self.log_dir)}

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, restore: Path | None = None, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        """Launch the job process (its own session, so stop() ends the JVM and Python workers too)."""
        self.status_path.unlink(missing_ok=True)
        if self.settings.source_options.kind == "files":  # the file source fails on a missing folder
            Path(self.settings.source_options.path).mkdir(parents=True, exist_ok=True)
        env = {**self.env(), **(extra_env or {})}
        with open(self.log_dir / "driver.log", "ab") as out:  # the child keeps its own handle
            return subprocess.Popen(self.command(restore), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=PROJECT_ROOT)

    def restart(self) -> tuple[subprocess.Popen, Path | None]:
        """Start again from the newest retained checkpoint (from scratch when there is none)."""
        self.stop()
        checkpoint = self.latest_checkpoint()
        return self.start(restore=checkpoint), checkpoint

    def stop(self) -> None:
        """End the job's process group if it is still alive."""
        pid = self.status().get("pid")
        if pid and process_alive(pid):
            terminate_group(pid)

    def wait_running(self, timeout: float = 180.0) -> dict:
        """Block until the job reports RUNNING; raise with the cause if it fails first."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = self.status()
            if status.get("status") == "RUNNING":
                return status
            if status.get("status") in ("FAILED", "CANCELED") or status.get("pid") and not process_alive(status["pid"]):
                raise StreamingJobError(f"{self.settings.name} failed to start: {status.get('error')} "
                                        f"(log: {self.log_dir})")
            time.sleep(0.5)
        raise StreamingJobError(f"{self.settings.name} not running after {timeout:.0f}s (log: {self.log_dir})")

    def run_to_end(self, timeout: float = 600.0) -> dict:
        """Run a batch job in the foreground; raise with the cause if it fails."""
        result = subprocess.run(self.command(), env=self.env(), cwd=PROJECT_ROOT, capture_output=True, text=True,
                                timeout=timeout)
        status = self.status()
        if result.returncode != 0 or status.get("status") != "FINISHED":
            raise StreamingJobError(f"{self.settings.name} ({self.mode}) failed: {status.get('error')}\n"
                                    f"{result.stderr[-3000:]}")
        return status

    # --- observation ---------------------------------------------------------------------------
    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def latest_checkpoint(self) -> Path | None:
        """The newest complete retained checkpoint of any earlier run of this job."""
        root = self.state_dir / "checkpoints"
        done = [p.parent for p in root.glob("*/chk-*/_metadata")] if root.exists() else []
        return max(done, key=lambda p: p.stat().st_mtime, default=None)

    def metrics(self) -> dict:
        """The job's own counts: lines read, malformed, late; the newest event time processed."""
        return job_metrics(self.sink_root / METRICS)

    def progress(self, now: float) -> dict:
        """The job's counts (metrics()) and its lag: `now` minus the newest event time processed."""
        metrics = self.metrics()
        newest = metrics["newest_event_time"]
        lag = now - _parse_time(newest).timestamp() if newest else None
        return {**metrics, "lag_seconds": round(lag, 1) if lag is not None else None}

    def health(self, now: float | None = None) -> JobHealth:
        now = now or time.time()
        status = self.status()
        state = status.get("status", "NOT_STARTED")
        pid = status.get("pid")
        if state not in ("FINISHED", "FAILED", "CANCELED", "NOT_STARTED") and not (pid and process_alive(pid)):
            state = "DIED"  # killed, or crashed before it could say so
        checkpoint = self.latest_checkpoint()
        healthy = state == "RUNNING" if self.mode == "streaming" else state == "FINISHED"
        return JobHealth(
            name=self.settings.name, status=state, healthy=healthy, pid=pid, job_id=status.get("job_id"),
            checkpoint=str(checkpoint) if checkpoint else None,
            checkpoint_age_seconds=round(now - checkpoint.stat().st_mtime, 1) if checkpoint else None,
            error=status.get("error") or (f"the job process {pid} is gone" if state == "DIED" else None),
            log_dir=str(self.log_dir), **self.progress(now),
        )


class OnlinePusher:
    """Applies a job's committed window results to the online store through Feast's push path.

    Per (view, entity) it remembers the newest window pushed, in SQLite next to the sink; a result
    for an older window is skipped, so the online value only moves forward, and applying the same
    file twice changes nothing.

    Flink emits no empty windows, so an entity missing from the newest window's results had no
    events in it: the pusher writes the view's empty values (zero counts, empty lists, null means
    and ratios) for it at that window, once, as the batch plan's zero rows do. Should that
    window's results for the entity arrive in a later commit (a job with several parallel
    subtasks), they replace the empty values, being as new."""

    def __init__(self, store, spec: FlinkJobSpec | dict,
                 on_push: Callable[[str, pd.DataFrame, float], None] | None = None, keep_seconds: float = 3600):
        self.store = store  # a feast.FeatureStore
        self.spec = spec.to_dict() if isinstance(spec, FlinkJobSpec) else spec
        self.on_push = on_push
        if keep_seconds < MIN_KEEP_SECONDS:
            raise ValueError(f"keep_seconds must be at least {MIN_KEEP_SECONDS}: a restart from a checkpoint may "
                             "commit again the files of the last checkpoints")
        self.keep_seconds = keep_seconds
        self.pruned_at = time.time()
        state = Path(self.spec["sink_root"]).parent / "pusher.db"
        state.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(state, check_same_thread=False)  # one poller at a time, any thread
        self.db.executescript(
            "CREATE TABLE IF NOT EXISTS applied_files (path TEXT PRIMARY KEY);"
            "CREATE TABLE IF NOT EXISTS newest_window (view TEXT, entity TEXT, window_end TEXT, "
            "PRIMARY KEY (view, entity));"
            "CREATE TABLE IF NOT EXISTS emptied (view TEXT, entity TEXT, PRIMARY KEY (view, entity));")
        self.applied = {view: {Path(p).name for (p,) in self.db.execute(  # file names, per view
            "SELECT path FROM applied_files WHERE path LIKE ?", (info["sink"] + "/%",))}
            for view, info in self.spec["views"].items()}

    def poll(self) -> dict[str, int]:
        """Push every newly committed result; returns rows pushed per view."""
        pushed = {}
        for view, info in self.spec["views"].items():
            sink, applied = Path(info["sink"]), self.applied[view]
            new_names = [name for name in committed_names(sink) if name not in applied]
            if not new_names:
                continue
            rows = [row for name in new_names for row in read_rows(sink / name)]
            pushed[view] = self._push(view, info, rows)
            with self.db:
                self.db.executemany("INSERT OR IGNORE INTO applied_files VALUES (?)",
                                    [(str(sink / name),) for name in new_names])
            applied.update(new_names)
        if time.time() - self.pruned_at >= PRUNE_EVERY_SECONDS:
            self.prune()
        return pushed

    def prune(self, now: float | None = None) -> int:
        """Deletes applied result files older than `keep_seconds` and folds older metric files into
        the job's totals, so that a job running for weeks keeps a small sink and a fast poll (the
        online store and `newest_window` hold what the deleted files said). Returns files deleted."""
        now = now or time.time()
        cutoff = now - self.keep_seconds
        deleted = 0
        for view, info in self.spec["views"].items():
            sink, applied = Path(info["sink"]), self.applied[view]
            old = [name for name in committed_names(sink)
                   if name in applied and (sink / name).stat().st_mtime < cutoff]
            for name in old:
                (sink / name).unlink()
            with self.db:
                self.db.executemany("DELETE FROM applied_files WHERE path = ?", [(str(sink / name),) for name in old])
            applied.difference_update(old)
            deleted += len(old)
        self.pruned_at = now
        return deleted + fold_metrics(Path(self.spec["sink_root"]) / METRICS, cutoff)

    def _push(self, view: str, info: dict, rows: list[dict]) -> int:
        if not rows:
            return 0
        keys = info["keys"]
        newest: dict[str, dict] = {}
        for row in rows:
            entity = json.dumps([row[k] for k in keys])
            if entity not in newest or newest[entity][WINDOW_END] <= row[WINDOW_END]:
                newest[entity] = row
        known = dict(self.db.execute("SELECT entity, window_end FROM newest_window WHERE view = ?", (view,)))
        fresh = {e: r for e, r in newest.items() if e not in known or known[e] <= r[WINDOW_END]}
        pushed = 0
        if fresh:
            frame = self._frame(info, list(fresh.values()))
            self.store.push(info["push_source"], frame, to=_push_mode_online())
            pushed_at = time.time()
            with self.db:
                self.db.executemany("INSERT OR REPLACE INTO newest_window VALUES (?, ?, ?)",
                                    [(view, e, r[WINDOW_END]) for e, r in fresh.items()])
                self.db.executemany("DELETE FROM emptied WHERE view = ? AND entity = ?",
                                    [(view, e) for e in fresh])
            if self.on_push:
                self.on_push(view, frame, pushed_at)
            pushed = len(frame)
        return pushed + self._empty_the_silent(view, info, max(r[WINDOW_END] for r in rows))

    def _empty_the_silent(self, view: str, info: dict, window_end: str) -> int:
        """Empty values at `window_end` for the entities without a result there, not yet emptied."""
        silent = [e for (e,) in self.db.execute(
            "SELECT entity FROM newest_window WHERE view = ? AND window_end < ? AND entity NOT IN "
            "(SELECT entity FROM emptied WHERE view = ?)", (view, window_end, view))]
        if not silent:
            return 0
        rows = [{**dict(zip(info["keys"], json.loads(e))), WINDOW_END: window_end, **info["empty"]} for e in silent]
        frame = self._frame(info, rows)
        # a millisecond before the window's end, so that a result of that window committed later
        # still replaces it in stores that keep only strictly newer values (Redis)
        frame["event_timestamp"] -= pd.Timedelta(milliseconds=1)
        self.store.push(info["push_source"], frame, to=_push_mode_online())
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO newest_window VALUES (?, ?, ?)",
                                [(view, e, window_end) for e in silent])
            self.db.executemany("INSERT OR REPLACE INTO emptied VALUES (?, ?)", [(view, e) for e in silent])
        return len(rows)

    @staticmethod
    def _frame(info: dict, rows: list[dict]) -> pd.DataFrame:
        frame = pd.DataFrame(rows)
        frame["event_timestamp"] = pd.to_datetime(frame.pop(WINDOW_END), utc=True)
        frame = frame[[*info["keys"], "event_timestamp", *info["features"]]]
        for feature, dtype in info["features"].items():  # no qualifying values: an empty list, as offline
            if dtype.endswith("_list"):
                frame[feature] = [v if isinstance(v, list) else [] for v in frame[feature]]
        return frame

    def close(self) -> None:
        self.db.close()


def committed_files(folder: Path) -> list[Path]:
    """Files the sink has committed (in-progress ones are hidden, named .part-...), in name order."""
    return [folder / name for name in committed_names(folder)]


def committed_names(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(folder) if entry.name.startswith("part-"))
    except FileNotFoundError:
        return []


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_committed_rows(folder: Path) -> list[dict[str, Any]]:
    return [row for path in committed_files(folder) for row in read_rows(path)]


def job_metrics(folder: Path) -> dict:
    """A job's counts from its metrics sink: the folded totals plus every committed file not folded."""
    while True:
        paths = committed_files(folder)  # before the totals: a file folded meanwhile is then named there
        base = _read_totals(folder)
        try:
            rows = [row for path in paths if path.name not in base["folded"] for row in read_rows(path)]
        except FileNotFoundError:
            continue  # folded and deleted after the totals were read: read again
        return _add_metrics(base["totals"], rows)


def fold_metrics(folder: Path, older_than: float) -> int:
    """Adds the committed metric files older than `older_than` (epoch seconds) to the totals file,
    then deletes them. The totals file names the files it took in until they are gone, so a fold cut
    short between the two steps neither counts a file twice nor loses one. Returns files folded."""
    base = _read_totals(folder)
    for name in base["folded"]:
        (folder / name).unlink(missing_ok=True)
    old = [p for p in committed_files(folder) if p.stat().st_mtime < older_than]  # the folded ones are gone now
    if not old and not base["folded"]:
        return 0
    totals = _add_metrics(base["totals"], [row for path in old for row in read_rows(path)])
    tmp = folder / f".{TOTALS_FILE}.tmp"
    tmp.write_text(json.dumps({"totals": totals, "folded": [p.name for p in old]}))
    tmp.replace(folder / TOTALS_FILE)
    for path in old:
        path.unlink()
    return len(old)


def _read_totals(folder: Path) -> dict:
    try:
        return json.loads((folder / TOTALS_FILE).read_text())
    except FileNotFoundError:
        return {"totals": {"records": 0, "malformed": 0, "late": 0, "newest_event_time": None}, "folded": []}


def _add_metrics(totals: dict, rows: list[dict]) -> dict:
    totals = dict(totals)
    for row in rows:
        for key in ("records", "malformed", "late"):
            totals[key] += row.get(key) or 0
        if row.get("max_event_time") and (totals["newest_event_time"] or "") < row["max_event_time"]:
            totals["newest_event_time"] = row["max_event_time"]
    return totals


def _push_mode_online():
    from feast.data_source import PushMode

    return PushMode.ONLINE


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace(" ", "T")).replace(tzinfo=UTC)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return True


def stage_landing(lake, source: str, days: list, out: Path, key: str | None = None) -> int:
    """The landing partitions of `days` as JSON-lines files in `out`, the backfill job's input
    (Flink's bundled formats read JSON, not Parquet). Re-deliveries of a `key` resolve as ingestion
    resolves them: the newest delivery wins, by arrival order (`Lake.landing_files_by_arrival`, then
    the line), so the history sees the warehouse's version of a corrected event. Unreadable lines
    pass through for the job to count."""
    import pyarrow.parquet as pq

    from engines.simulator.files import to_jsonl

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = [(day, path) for day in days for path in lake.landing_files_by_arrival(source, day)]
    lines = [(to_jsonl(pq.read_table(path)) if path.suffix == ".parquet" else path.read_text()).splitlines()
             for _, path in files]
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


def backfill(settings: StreamingJobSettings, lake, days: list, catalogue: Catalogue = default_catalogue,
             timeout: float = 900.0) -> tuple[FlinkJob, dict]:
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
    job = FlinkJob(replace(settings, state_dir=run_dir, source_options=SourceOptions(path=str((run_dir / "input")
                                                                                             .resolve()))),
                   catalogue, mode="batch")
    job.run_to_end(timeout)
    return job, {"lines_staged": staged, "days_staged": len(staged_days), **job.metrics()}


def days_before(source: str, catalogue: Catalogue = default_catalogue) -> int:
    """How many days before a day the windows ending on it reach back, over the source's streaming views."""
    reach = max(v.max_window for v in catalogue.views if v.streaming and v.source.name == source)
    return -(-reach // timedelta(days=1))


def window_rows(job: FlinkJob, view: FeatureView) -> pl.DataFrame:
    """A view's window results shaped like its offline table: keys, `event_timestamp` (the end of
    the window) and the features, typed; one row per entity and window."""
    schema = output_schema(view)
    rows = read_committed_rows(job.sink_root / view.name)
    if not rows:
        return pl.DataFrame(schema=schema)
    frame = pl.DataFrame(rows, infer_schema_length=None).with_columns(
        pl.col(WINDOW_END).str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_zone="UTC").alias(TIMESTAMP))
    # no qualifying values: an empty list, as offline and online (the pusher) have it
    typed = [pl.col(c).cast(t).fill_null(pl.lit([], dtype=t)) if isinstance(t, pl.List) else pl.col(c).cast(t)
             for c, t in schema.items()]
    return frame.select(typed).sort([TIMESTAMP, *view.join_keys])


def rows_by_day(rows: pl.DataFrame, days: list[date]) -> dict[date, pl.DataFrame]:
    """Window rows per day: a day holds the windows ending after its midnight, up to and including
    the next one (the end of day D is the offline table's timestamp of D)."""
    ts = pl.col(TIMESTAMP)
    return {day: rows.filter((ts > day_end(day - timedelta(days=1))) & (ts <= day_end(day))) for day in days}


def differences_from_offline(view: FeatureView, windows: pl.DataFrame, offline: pl.DataFrame,
                             limit: int = 20) -> list[dict]:
    """Where a day's window rows ending at the end of the day disagree with the view's offline
    row of that day (the polars plan), up to `limit`. An entity missing from the windows had no
    events in them, so its offline counts must be zero."""
    keys, counts = view.join_keys, [f.name for f in view.features if view.dtype_of(f) == "int64"]
    at_end = windows.filter(pl.col(TIMESTAMP) == offline[TIMESTAMP].max()) if offline.height else windows.clear()
    differences = [{"entity": json.dumps(row), "feature": "(row)", "windows": "present", "offline": "missing"}
                   for row in at_end.join(offline, on=keys, how="anti").select(keys).head(limit).to_dicts()]
    for row in offline.join(at_end, on=keys, how="anti").filter(pl.sum_horizontal(counts) != 0).head(limit).to_dicts():
        differences.append({"entity": json.dumps({k: row[k] for k in keys}), "feature": "(row)",
                            "windows": "no events", "offline": json.dumps({c: row[c] for c in counts})})
    both = at_end.join(offline, on=keys, suffix="__offline")
    for feature in view.feature_names:
        got, want = pl.col(feature), pl.col(f"{feature}__offline")
        if both.schema[feature] == pl.Float64:
            same = (got - want).abs() <= 1e-9 * pl.max_horizontal(want.abs(), pl.lit(1.0))
        else:
            same = got == want
        unequal = both.filter(~same.fill_null(got.is_null() & want.is_null()))
        differences += [{"entity": json.dumps({k: r[k] for k in keys}), "feature": feature,
                         "windows": str(r[feature]), "offline": str(r[f"{feature}__offline"])}
                        for r in unequal.head(limit).to_dicts()]
    return differences[:limit]


def terminate_group(pid: int, grace_seconds: float = 5.0) -> None:
    """SIGTERM a process group, SIGKILL if it lingers."""
    try:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.time() + grace_seconds
        while process_alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        if process_alive(pid):
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class FlinkSqlGateway:
    """The cluster path: submits a job spec's SQL to a Flink SQL Gateway (REST API v2) and watches
    the job through the JobManager's REST API. The gateway's cluster needs the Kafka SQL connector
    JAR (flink-sql-connector-kafka) on its classpath; the sink folder must be shared storage that
    the pusher can read."""

    def __init__(self, gateway_url: str, rest_url: str, timeout: float = 30.0):
        import httpx

        self.gateway = httpx.Client(base_url=gateway_url.rstrip("/"), timeout=timeout)
        self.rest = httpx.Client(base_url=rest_url.rstrip("/"), timeout=timeout)

    def submit(self, job: FlinkJob, restore: str | None = None) -> str:
        spec = job.spec()
        session = self.gateway.post("/v2/sessions", json={"sessionName": spec.name}).raise_for_status().json()
        handle = session["sessionHandle"]
        settings = {"pipeline.name": spec.name, "restart-strategy.type": "none",
                    "execution.checkpointing.interval": f"{job.settings.checkpoint_interval_ms}ms",
                    "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"}
        if restore:
            settings["execution.state-recovery.path"] = restore
        statements = [f"SET '{k}' = '{v}'" for k, v in settings.items()] + spec.statements
        statements.append("EXECUTE STATEMENT SET BEGIN " + "; ".join(spec.inserts) + "; END")
        result = {}
        for statement in statements:
            operation = self.gateway.post(f"/v2/sessions/{handle}/statements",
                                          json={"statement": statement}).raise_for_status().json()
            result = self._result(handle, operation["operationHandle"])
        job_id = result.get("jobID") or result["results"]["data"][0]["fields"][0]
        job.status_path.parent.mkdir(parents=True, exist_ok=True)
        job.status_path.write_text(json.dumps({"name": spec.name, "mode": spec.mode, "job_id": job_id,
                                               "status": "RUNNING", "restored_from": restore}))
        return job_id

    def _result(self, session: str, operation: str) -> dict:
        for _ in range(120):
            response = self.gateway.get(f"/v2/sessions/{session}/operations/{operation}/result/0")
            if response.status_code == 200 and response.json().get("resultType") != "NOT_READY":
                return response.json()
            time.sleep(0.5)
        raise StreamingJobError(f"the SQL gateway did not finish operation {operation}")

    def health(self, job: FlinkJob) -> JobHealth:
        job_id = job.status().get("job_id")
        if not job_id:
            return JobHealth(name=job.settings.name, status="NOT_STARTED", healthy=False)
        state = self.rest.get(f"/jobs/{job_id}").raise_for_status().json()["state"]
        latest = self.rest.get(f"/jobs/{job_id}/checkpoints").raise_for_status().json().get("latest", {})
        completed = latest.get("completed") or {}
        age = time.time() - completed["latest_ack_timestamp"] / 1000 if completed else None
        return JobHealth(name=job.settings.name, status=state, healthy=state == "RUNNING", job_id=job_id,
                         checkpoint=completed.get("external_path"), checkpoint_age_seconds=age,
                         **job.progress(time.time()))


def run_pusher(config_path: Path, interval_seconds: float = 0.5) -> None:
    """The pusher process (FlinkResource starts it): apply committed results until terminated."""
    from engines.feature_store import FeatureStoreEngine, FeatureStoreSettings

    config = json.loads(config_path.read_text())
    spec = json.loads(Path(config.pop("spec")).read_text())
    settings = FeatureStoreSettings(**{**config, "repo_dir": Path(config["repo_dir"]),
                                       "offline_root": Path(config["offline_root"])})
    pusher = OnlinePusher(FeatureStoreEngine(settings).store, spec)
    while True:
        pushed = pusher.poll()
        if pushed:
            print(json.dumps({"at": time.time(), "pushed": pushed}), flush=True)
        time.sleep(interval_seconds)


if __name__ == "__main__":
    import sys

    run_pusher(Path(sys.argv[1]))
