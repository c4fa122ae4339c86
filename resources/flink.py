from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

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
    FlinkJob,
    FlinkSqlGateway,
    JobHealth,
    SourceOptions,
    StreamingJobError,
    StreamingJobSettings,
    process_alive,
    terminate_group,
)
from resources.feature_store import FeatureStoreResource


class FlinkResource(ConfigurableResource):
    """Streaming feature jobs compiled from the DSL (one per event source with streaming views).

    `mode="local"` (default) runs each job on a PyFlink mini-cluster, a process of .venv-flink
    launched through dagster-pipes, reading the directory the simulator's streaming mode appends
    to. `mode="cluster"` submits the same SQL to a Flink cluster's SQL Gateway REST endpoint and
    watches it through the JobManager's REST API, reading Kafka (see README, Streaming features).
    A pusher process applies the job's committed results to the online store.
    """

    feature_store: FeatureStoreResource
    mode: str = Field(default="local", description="'local' (mini-cluster) or 'cluster' (REST)")
    source: str = Field(default="files", description="'files' (a directory per event source) or 'kafka'")
    events_dir: str | None = Field(default=None, description="files: default <lake>/stream/<source>")
    state_dir: str | None = Field(default=None, description="checkpoints, sinks, status; default <lake>/streaming")
    kafka_bootstrap_servers: str = ""
    kafka_topic_prefix: str = Field(default="mlplane.", description="kafka: topic = prefix + source name")
    sql_gateway_url: str = Field(default="", description="cluster: Flink SQL Gateway, e.g. http://flink-sql:8083")
    rest_url: str = Field(default="", description="cluster: JobManager REST, e.g. http://flink-jobmanager:8081")
    flink_python: str = str(DEFAULT_FLINK_PYTHON)
    slide_seconds: int = Field(default=60, description="how often windows emit (== window: tumbling)")
    watermark_delay_seconds: int = Field(default=5, description="how late an event may be and still count")
    checkpoint_interval_ms: int = 2000
    start_timeout_seconds: float = 300.0

    # --- jobs ------------------------------------------------------------------------------------
    def job(self, source: str) -> FlinkJob:
        lake = Path(self.feature_store.lake.root)
        state = Path(self.state_dir) if self.state_dir else lake / "streaming"
        if self.source == "kafka":
            options = SourceOptions(kind="kafka", bootstrap_servers=self.kafka_bootstrap_servers,
                                    topic=f"{self.kafka_topic_prefix}{source}")
        else:
            events = Path(self.events_dir) / source if self.events_dir else lake / "stream" / source
            events.mkdir(parents=True, exist_ok=True)
            options = SourceOptions(path=str(events.resolve()))
        return FlinkJob(StreamingJobSettings(
            source=source, state_dir=state / source, source_options=options, slide_seconds=self.slide_seconds,
            watermark_delay_seconds=self.watermark_delay_seconds, checkpoint_interval_ms=self.checkpoint_interval_ms,
            flink_python=Path(self.flink_python)))

    def health(self, source: str) -> JobHealth:
        job = self.job(source)
        if self.mode == "cluster":
            return self._gateway().health(job)
        return job.health()

    def launch(self, context, source: str) -> tuple[JobHealth, dict]:
        """Start the job, from its newest checkpoint when it has one; returns its health once it
        runs and what it reported through dagster-pipes. Raises with the cause if it fails."""
        job = self.job(source)
        if self.mode == "cluster":  # resume from the failed job's newest retained checkpoint, if any
            gateway = self._gateway()
            checkpoint = gateway.health(job).checkpoint
            gateway.submit(job, restore=checkpoint)
            return gateway.health(job), {"restored_from": checkpoint}
        checkpoint = job.latest_checkpoint()
        job.stop()
        with open_pipes_session(context=context, context_injector=PipesEnvContextInjector(),
                                message_reader=PipesTempFileMessageReader()) as session:
            process = job.start(restore=checkpoint, extra_env=session.get_bootstrap_env_vars())
            deadline = time.time() + self.start_timeout_seconds
            while not session.get_custom_messages() and process.poll() is None and time.time() < deadline:
                time.sleep(0.5)
            reported = session.get_custom_messages()[-1] if session.get_custom_messages() else {}
        if reported.get("status") != "RUNNING":
            job.stop()
            raise StreamingJobError(f"{job.settings.name} did not start: {job.status().get('error') or reported} "
                                    f"(log: {job.log_dir})")
        self.start_pusher(source)
        return job.health(), {**reported, "restored_from": str(checkpoint) if checkpoint else None}

    def start_pusher(self, source: str) -> int:
        """The main-environment process that applies committed results with FeatureStore.push."""
        job = self.job(source)
        pid_file = job.state_dir / "pusher.pid"
        if pid_file.exists() and process_alive(int(pid_file.read_text())):
            return int(pid_file.read_text())
        store = self.feature_store.engine().settings
        config = {"spec": str(job.write_spec()), "repo_dir": str(store.repo_dir),
                  "offline_root": str(store.offline_root), "project": store.project,
                  "online_store": store.online_store, "redis_url": store.redis_url,
                  "registry_url": store.registry_url}
        (job.state_dir / "pusher.json").write_text(json.dumps(config))
        with open(job.log_dir / "pusher.log", "ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "engines.streaming", str(job.state_dir / "pusher.json")],
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=PROJECT_ROOT)
        pid_file.write_text(str(process.pid))
        return process.pid

    def stop(self, source: str) -> None:
        job = self.job(source)
        job.stop()
        pid_file = job.state_dir / "pusher.pid"
        if pid_file.exists():
            terminate_group(int(pid_file.read_text()))
            pid_file.unlink()

    def _gateway(self) -> FlinkSqlGateway:
        if not (self.sql_gateway_url and self.rest_url):
            raise StreamingJobError("mode 'cluster' needs sql_gateway_url and rest_url")
        return FlinkSqlGateway(self.sql_gateway_url, self.rest_url)
