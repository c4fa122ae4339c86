from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from dagster import (
    ConfigurableResource,
    PipesEnvContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)
from pydantic import Field

from engines.streaming import (
    DEFAULT_FLINK_PYTHON,
    PROJECT_ROOT,
    ClusterJob,
    FlinkJob,
    JobHealth,
    PusherConfig,
    SourceOptions,
    StreamingJobError,
    StreamingJobSettings,
    make_job,
    process_alive,
    terminate_group,
)
from engines.streaming.backlog import catch_up, resume
from resources.feature_store import FeatureStoreResource


class FlinkResource(ConfigurableResource):
    """Streaming feature jobs compiled from the DSL (one per event source with streaming views).

    `mode="local"` (default) runs each job on a PyFlink mini-cluster, a process of .venv-flink
    launched through dagster-pipes, reading the directory the simulator's streaming mode appends
    to. `mode="cluster"` submits the same job to a Flink session cluster (remote execution) and
    watches it through the JobManager's REST API, reading Kafka (see README, Streaming features);
    the backfill runs there too. `state_dir` must then be storage the cluster and the pusher share.
    A pusher process applies the job's committed results to the online store.
    """

    feature_store: FeatureStoreResource
    mode: str = Field(default="local", description="'local' (mini-cluster) or 'cluster' (a session cluster)")
    source: str = Field(default="files", description="'files' (a directory per event source) or 'kafka'")
    events_dir: str | None = Field(default=None, description="files: default <lake>/stream/<source>")
    state_dir: str | None = Field(default=None, description="checkpoints, sinks, status; default <lake>/streaming")
    kafka_bootstrap_servers: str = ""
    kafka_topic_prefix: str = Field(default="mlplane.", description="kafka: topic = prefix + source name")
    rest_url: str = Field(default="", description="cluster: JobManager REST, e.g. http://flink-jobmanager:8081")
    flink_python: str = str(DEFAULT_FLINK_PYTHON)
    slide_seconds: int = Field(default=60, description="how often windows emit (== window: tumbling)")
    watermark_delay_seconds: float = Field(default=5, description="how late an event may be and still count")
    checkpoint_interval_ms: int = 2000
    sink_roll_ms: int = Field(
        default=1000, description="how often the sink closes a file (visible at the next checkpoint)"
    )
    watermark_interval_ms: int = Field(default=200, description="how often the watermark moves on")
    state_backend: Literal["hashmap", "rocksdb"] = Field(
        default="hashmap", description="operator state on the JVM heap, or in RocksDB on local disk (beyond the heap)"
    )
    jvm_heap: str = Field(
        default="2g", description="local mode: the job's JVM heap (live rows keep the window's events there)"
    )
    pusher_interval_seconds: float | None = Field(
        default=None,
        description="how often the pusher looks for committed results; by default 0.1 s with live rows "
        "(an idle poll lists a minute of their files: 1.7 ms at 600 per view), else 0.5 s",
    )
    live_rows: bool = Field(
        default=False,
        description="a row per event for views over a trailing window: fresh within a second, not a slide "
        "(training sets cannot reproduce them yet: they refuse to build while this is on)",
    )
    start_timeout_seconds: float = 300.0

    # --- jobs ------------------------------------------------------------------------------------
    def job(self, source: str) -> FlinkJob:
        lake = Path(self.feature_store.lake.root)
        state = Path(self.state_dir) if self.state_dir else lake / "streaming"
        if self.source == "kafka":
            options = SourceOptions(
                kind="kafka", bootstrap_servers=self.kafka_bootstrap_servers, topic=f"{self.kafka_topic_prefix}{source}"
            )
        else:
            events = Path(self.events_dir) / source if self.events_dir else lake / "stream" / source
            events.mkdir(parents=True, exist_ok=True)
            options = SourceOptions(path=str(events.resolve()))
        return make_job(
            StreamingJobSettings(
                source=source,
                state_dir=state / source,
                source_options=options,
                slide_seconds=self.slide_seconds,
                watermark_delay_seconds=self.watermark_delay_seconds,
                checkpoint_interval_ms=self.checkpoint_interval_ms,
                sink_roll_ms=self.sink_roll_ms,
                watermark_interval_ms=self.watermark_interval_ms,
                state_backend=self.state_backend,
                live_rows=self.live_rows,
                jvm_heap=self.jvm_heap,
                flink_python=Path(self.flink_python),
                rest=self._rest(),
            )
        )

    @property
    def pusher_interval(self) -> float:
        if self.pusher_interval_seconds is not None:
            return self.pusher_interval_seconds
        return 0.1 if self.live_rows else 0.5  # a live row waits for the poll too

    def health(self, source: str) -> JobHealth:
        return self.job(source).health()

    def launch(self, context, source: str) -> tuple[JobHealth, dict]:
        """Start the job, from its newest checkpoint when it has one; returns its health once it
        runs and what it reported through dagster-pipes. Raises with the cause if it fails."""
        if missing := self.missing_setting():
            raise StreamingJobError(f"the live {source} job needs configuration: {missing}")
        job = self.job(source)
        if isinstance(job, ClusterJob):  # resume from the ended job's newest retained checkpoint, if any
            checkpoint = resume(job, self.start_timeout_seconds)
            self.start_pusher(source)
            return job.health(), {
                "status": "RUNNING",
                "job_id": job.status()["job_id"],
                "restored_from": str(checkpoint) if checkpoint else None,
            }
        job.stop()
        checkpoint = catch_up(job, self.start_timeout_seconds)  # the events that landed while it was down
        with open_pipes_session(
            context=context, context_injector=PipesEnvContextInjector(), message_reader=PipesTempFileMessageReader()
        ) as session:
            process = job.start(restore=checkpoint, extra_env=session.get_bootstrap_env_vars())
            deadline = time.time() + self.start_timeout_seconds
            while not session.get_custom_messages() and process.poll() is None and time.time() < deadline:
                time.sleep(0.5)
            reported = session.get_custom_messages()[-1] if session.get_custom_messages() else {}
        if reported.get("status") != "RUNNING":
            job.stop()
            raise StreamingJobError(
                f"{job.settings.name} did not start: {job.status().get('error') or reported} (log: {job.log_dir})"
            )
        self.start_pusher(source)
        return job.health(), {**reported, "restored_from": str(checkpoint) if checkpoint else None}

    def start_pusher(self, source: str) -> int:
        """The main-environment process that applies committed results to the online store."""
        job = self.job(source)
        pid_file = job.state_dir / "pusher.pid"
        if pid_file.exists() and process_alive(int(pid_file.read_text())):
            return int(pid_file.read_text())
        store = self.feature_store.get_client().settings
        config = PusherConfig(
            spec=job.write_spec(),
            store={
                "repo_dir": str(store.repo_dir),
                "offline_root": str(store.offline_root),
                "project": store.project,
                "online_store": store.online_store,
                "redis_url": store.redis_url,
                "registry_url": store.registry_url,
            },
            interval_seconds=self.pusher_interval,
        )
        config.write(job.state_dir / "pusher.json")
        job.log_dir.mkdir(parents=True, exist_ok=True)
        with open(job.log_dir / "pusher.log", "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "engines.streaming", str(job.state_dir / "pusher.json")],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=PROJECT_ROOT,
            )
        pid_file.write_text(str(process.pid))
        return process.pid

    def stop(self, source: str) -> None:
        job = self.job(source)
        job.stop()
        pid_file = job.state_dir / "pusher.pid"
        if pid_file.exists():
            terminate_group(int(pid_file.read_text()))
            pid_file.unlink()

    def missing_setting(self, live: bool = True) -> str | None:
        """What a cluster deployment has left unset, named as the prod profile's variable; None when complete.
        Kafka is needed by the live jobs only (`live=False`: a backfill reads the lake's staged files)."""
        if self.mode == "cluster" and not self.rest_url:
            return "MLPLANE_FLINK_REST_URL (the Flink JobManager's REST address) is not set"
        if live and self.source == "kafka" and not self.kafka_bootstrap_servers:
            return "MLPLANE_KAFKA_BOOTSTRAP_SERVERS (the Kafka brokers the jobs read) is not set"
        return None

    def _rest(self) -> str:
        if self.mode not in ("local", "cluster"):
            raise StreamingJobError(f"mode must be 'local' or 'cluster', not {self.mode!r}")
        if missing := self.missing_setting(live=False):
            raise StreamingJobError(f"the {self.mode} streaming jobs need configuration: {missing}")
        return self.rest_url if self.mode == "cluster" else ""
