"""A streaming (or batch) job compiled from the DSL, run on a PyFlink mini-cluster as a process of
.venv-flink, with its health. Flink runs in its own environment (.venv-flink cannot import Feast):
the job body (jobs/flink/run_job.py) only runs the generated SQL."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from engines.streaming.sink import job_metrics
from feature_defs import catalogue as default_catalogue
from feature_defs.compile.flink import METRICS, FlinkJobSpec, SourceOptions, flink_job
from feature_defs.compile.streaming import streaming_plan
from feature_defs.dsl import Catalogue

PROJECT_ROOT = Path(__file__).resolve().parents[2]
JOB_BODY = PROJECT_ROOT / "jobs" / "flink" / "run_job.py"
JOB_LOG_CONFIG = PROJECT_ROOT / "jobs" / "flink" / "log4j.properties"  # keeps a crashed run's log
DEFAULT_FLINK_PYTHON = PROJECT_ROOT / ".venv-flink" / "bin" / "python"
CONNECTORS_JAR = "mlplane-connectors.jar"  # in the Flink environment; built by scripts/setup-flink
# for a JVM that lives seconds or minutes, not hours: the first tier of the JIT only. Most of a
# job's start is the planner's code running cold, and the optimizing compiler's (C2) compilations
# compete with it for the cores while they pay off only in a long run. The submitting client of a
# cluster job always runs so (ClusterJob.env); a local job, when its settings ask for it
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


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
    watermark_delay_seconds: float = 5  # how late (event time) an event may arrive and still count
    checkpoint_interval_ms: int = 2000  # results become visible at the first checkpoint after their file is closed
    sink_roll_ms: int = 1000  # how often the sink closes its files
    # how often the watermark moves on (Flink's pipeline.auto-watermark-interval): a window or a live
    # row is emitted up to this much after its time has passed
    watermark_interval_ms: int = 200
    # a row per event for the views over a trailing window (the value just after it), beside the
    # window ends: fresh within a second instead of a slide; training sets do not model them yet
    live_rows: bool = False
    # Flink's changelog state backend: state changes stream to <state_dir>/changelog as they happen
    # and a checkpoint uploads only what changed since the last one. A full heap snapshot at every
    # checkpoint took most of the job's time at 5,000 events/s with live rows (jstack), and it grows
    # with the windows' state
    state_changelog: bool = True
    # where operator state lives: "hashmap" (the JVM heap, fastest) or "rocksdb" (local disk, for
    # state beyond the heap: live rows hold each entity's events of the window)
    state_backend: str = "hashmap"
    flink_python: Path = DEFAULT_FLINK_PYTHON
    # the local mini-cluster's heap: live rows keep each entity's events of the window there; at
    # 20,000 events/s a 512 MB heap kept G1 busy more than half a core (top -H) and live rows lagged 3-6 s
    jvm_heap: str = "2g"
    # a local batch job (the backfill): one slot per core and room for its hash aggregations, which
    # otherwise spill; measured on the demo's 4 days at the 60 s slide: 293 s -> 137 s of Flink on 2 cores
    batch_parallelism: int = 2
    batch_jvm_heap: str = "2g"
    batch_managed_memory: str = "1g"
    # more options for the local mini-cluster's JVM, e.g. SHORT_LIVED_JVM_OPTIONS for a run of
    # minutes over little data, which then starts sooner; a long-running job keeps the default,
    # whose optimizing compiler serves its throughput
    jvm_options: str = ""
    # HOST:PORT of a session cluster's JobManager REST API: the job runs there (engines.streaming.cluster);
    # empty: on a local mini-cluster, a process of .venv-flink. The state folder must be storage
    # that the cluster and the pusher share.
    rest: str = ""
    restart_attempts: int = 3  # cluster: restarts from the newest checkpoint (a lost TaskManager) before FAILED

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
    restarts: int = 0  # cluster: times Flink restarted the job from a checkpoint

    def to_dict(self) -> dict:
        return asdict(self)


class FlinkJob:
    """One streaming (or batch) job on the local mini-cluster, as a process of .venv-flink."""

    def __init__(
        self,
        settings: StreamingJobSettings,
        catalogue: Catalogue = default_catalogue,
        mode: Literal["streaming", "batch"] = "streaming",
    ):
        self.settings = settings
        self.catalogue = catalogue
        self.mode = mode
        self.state_dir = settings.state_dir
        self.sink_root = self.state_dir / "sink"
        self.status_path = self.state_dir / "status.json"
        self.log_dir = self.state_dir / "log"
        self.watermark_hold_seconds = 0  # added to the watermark delay while a backlog is caught up (backlog.py)

    # --- definition --------------------------------------------------------------------------
    def spec(self) -> FlinkJobSpec:
        source = self.settings.source
        plans = [streaming_plan(v) for v in self.catalogue.views if v.streaming and v.source.name == source]
        if not plans:
            raise StreamingJobError(f"no streaming feature views read source {self.settings.source!r}")
        return flink_job(
            self.settings.name,
            plans,
            self.settings.source_options,
            str(self.sink_root.resolve()),
            mode=self.mode,
            slide_seconds=self.settings.slide_seconds,
            watermark_delay_seconds=self.settings.watermark_delay_seconds + self.watermark_hold_seconds,
            roll_ms=self.settings.sink_roll_ms,
            live_rows=self.settings.live_rows,
        )

    def write_spec(self) -> Path:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / "spec.json"
        path.write_text(json.dumps(self.spec().to_dict(), indent=2))
        return path

    def command(self, restore: Path | None = None) -> list[str]:
        python = Path(self.settings.flink_python)
        if not python.exists():
            raise StreamingJobError(f"the Flink environment {python} is missing: run scripts/setup-flink")
        connectors = python.parents[1] / CONNECTORS_JAR  # the job body adds it to every job
        if not connectors.exists():
            raise StreamingJobError(f"our Flink connectors {connectors} are missing: run scripts/setup-flink")
        command = [
            str(python),
            str(JOB_BODY),
            str(self.write_spec()),
            "--state-dir",
            str(self.state_dir),
            "--checkpoint-interval-ms",
            str(self.settings.checkpoint_interval_ms),
            "--watermark-interval-ms",
            str(self.settings.watermark_interval_ms),
        ]
        if self.mode == "streaming" and self.settings.state_changelog:
            command.append("--state-changelog")
        if self.mode == "streaming":
            command += ["--state-backend", self.settings.state_backend]
        if self.mode == "batch" and not self.settings.rest:
            command += ["--parallelism", str(self.settings.batch_parallelism)]
            command += ["--managed-memory", self.settings.batch_managed_memory]
        return command + (["--restore", str(restore)] if restore else [])

    def env(self) -> dict[str, str]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        heap = self.settings.batch_jvm_heap if self.mode == "batch" else self.settings.jvm_heap
        return {
            **os.environ,
            "JVM_ARGS": f"-Xmx{heap} {self.settings.jvm_options}".strip(),
            "FLINK_LOG_DIR": str(self.log_dir),
            "LOG4J_PROPERTIES": str(JOB_LOG_CONFIG),
        }

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, restore: Path | None = None, extra_env: Mapping[str, str] | None = None) -> subprocess.Popen:
        """Launch the job process (its own session, so stop() ends the JVM and Python workers too)."""
        self.status_path.unlink(missing_ok=True)
        self.prepare_source()
        env = {**self.env(), **(extra_env or {})}
        with open(self.log_dir / "driver.log", "ab") as out:  # the child keeps its own handle
            return subprocess.Popen(
                self.command(restore),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=PROJECT_ROOT,
            )

    def prepare_source(self) -> None:
        if self.settings.source_options.kind == "files":  # the file source fails on a missing folder
            Path(self.settings.source_options.path).mkdir(parents=True, exist_ok=True)

    def restart(self) -> tuple[subprocess.Popen, Path | None]:
        """Start again from the newest retained checkpoint (from scratch when there is none); after
        downtime, `engines.streaming.backlog.resume` catches up the events that landed meanwhile."""
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
                raise StreamingJobError(
                    f"{self.settings.name} failed to start: {status.get('error')} (log: {self.log_dir})"
                )
            time.sleep(0.5)
        raise StreamingJobError(f"{self.settings.name} not running after {timeout:.0f}s (log: {self.log_dir})")

    def run_to_end(self, timeout: float = 600.0) -> dict:
        """Run a batch job in the foreground; raise with the cause if it fails."""
        result = subprocess.run(
            self.command(), env=self.env(), cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=timeout
        )
        status = self.status()
        if result.returncode != 0 or status.get("status") != "FINISHED":
            raise StreamingJobError(
                f"{self.settings.name} ({self.mode}) failed: {status.get('error')}\n{result.stderr[-3000:]}"
            )
        return status

    # --- observation ---------------------------------------------------------------------------
    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def latest_checkpoint(self) -> Path | None:
        """The newest complete retained checkpoint of any earlier run of this job."""
        newest = self._newest_checkpoint()
        return newest[0] if newest else None

    def _newest_checkpoint(self) -> tuple[Path, int] | None:
        """The complete checkpoint whose metadata was written last (once, last; a folder's own time
        changes while Flink writes or deletes in it), and when, in epoch nanoseconds."""
        written = {}
        for metadata in (self.state_dir / "checkpoints").glob("*/chk-*/_metadata"):
            with contextlib.suppress(FileNotFoundError):  # a running job deletes the ones it subsumes
                written[metadata.parent] = (metadata.stat().st_mtime_ns, int(metadata.parent.name[4:]))
        newest = max(written, key=written.__getitem__, default=None)
        return (newest, written[newest][0]) if newest else None

    def metrics(self) -> dict:
        """The job's own counts: lines read, malformed, late; the newest event time processed."""
        return job_metrics(self.sink_root / METRICS)

    def progress(self, now: float) -> dict:
        """The job's counts (metrics()) and its lag: `now` minus the newest event time processed."""
        metrics = self.metrics()
        newest = metrics["newest_event_time"]
        lag = now - parse_time(newest).timestamp() if newest else None
        return {**metrics, "lag_seconds": round(lag, 1) if lag is not None else None}

    def health(self, now: float | None = None) -> JobHealth:
        now = now or time.time()
        status = self.status()
        state = status.get("status", "NOT_STARTED")
        pid = status.get("pid")
        if state not in ("FINISHED", "FAILED", "CANCELED", "NOT_STARTED") and not (pid and process_alive(pid)):
            state = "DIED"  # killed, or crashed before it could say so
        checkpoint, written_ns = self._newest_checkpoint() or (None, 0)
        healthy = state == "RUNNING" if self.mode == "streaming" else state == "FINISHED"
        return JobHealth(
            name=self.settings.name,
            status=state,
            healthy=healthy,
            pid=pid,
            job_id=status.get("job_id"),
            checkpoint=str(checkpoint) if checkpoint else None,
            checkpoint_age_seconds=round(now - written_ns / 1e9, 1) if checkpoint else None,
            error=status.get("error") or (f"the job process {pid} is gone" if state == "DIED" else None),
            log_dir=str(self.log_dir),
            **self.progress(now),
        )


def parse_time(text: str) -> datetime:
    """An ISO-8601 time as UTC: Flink's (no zone, UTC) or a producer's ('Z' or an offset)."""
    moment = datetime.fromisoformat(text.replace(" ", "T"))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


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
