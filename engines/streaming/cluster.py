"""The production path: the same compiled job on a Flink session cluster. The job body submits it
(`execution.target: remote`) and returns; the JobManager's REST API says how it runs, its
checkpoints and restarts. Flink's restart strategy is on here (a lost TaskManager is a routine
event on a cluster): the job resumes from its newest checkpoint on another TaskManager, and the
restarts show in the job's health; when the attempts run out the job is FAILED, which the sensor
reports. Checkpoints and sink files go to the job's state folder, which must be storage that the
cluster and the pusher share.

`StandaloneCluster` starts a session cluster from the PyFlink wheel's own `bin/` (a JobManager
and TaskManagers, each a process of its own, with their own configuration folder and ports): the
tests' cluster, and a way to try the production path on one machine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from engines.streaming.job import (
    DEFAULT_FLINK_PYTHON,
    PROJECT_ROOT,
    SHORT_LIVED_JVM_OPTIONS,
    FlinkJob,
    JobHealth,
    StreamingJobError,
    StreamingJobSettings,
    process_alive,
    terminate_group,
)
from feature_defs import catalogue as default_catalogue
from feature_defs.dsl import Catalogue

TERMINAL = {"FINISHED", "FAILED", "CANCELED"}
SELF_HEALING = {"RUNNING", "RESTARTING", "INITIALIZING", "CREATED"}


class JobNotFound(StreamingJobError):
    """The cluster does not know the job (it was restarted, or the job ended long ago)."""


class FlinkRest:
    """The JobManager's REST API (the parts the platform reads)."""

    def __init__(self, address: str, timeout: float = 10.0):
        url = address if "://" in address else f"http://{address}"
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)

    def get(self, path: str) -> dict:
        try:
            return self.http.get(path).raise_for_status().json()
        except httpx.HTTPStatusError as error:
            if error.response.status_code == 404:
                raise JobNotFound(f"the Flink JobManager at {self.http.base_url} does not know {path}") from error
            raise StreamingJobError(
                f"the Flink JobManager at {self.http.base_url} answered {path} with {error.response.status_code}"
            ) from error
        except httpx.HTTPError as error:
            raise StreamingJobError(
                f"the Flink JobManager at {self.http.base_url} did not answer {path}: {error}"
            ) from error

    def overview(self) -> dict:
        return self.get("/overview")

    def job(self, job_id: str) -> dict:
        return self.get(f"/jobs/{job_id}")

    def checkpoints(self, job_id: str) -> dict:
        return self.get(f"/jobs/{job_id}/checkpoints")

    def failure(self, job_id: str) -> str | None:
        """The root cause of the job's newest failure, if any."""
        history = self.get(f"/jobs/{job_id}/exceptions").get("exceptionHistory", {}).get("entries", [])
        return history[0]["stacktrace"][-4000:] if history else None

    def cancel(self, job_id: str) -> None:
        self.http.patch(f"/jobs/{job_id}", params={"mode": "cancel"})

    def job_taskmanagers(self, job_id: str) -> set[str]:
        """Resource ids of the TaskManagers running the job's tasks now."""
        running = set()
        for vertex in self.job(job_id)["vertices"]:
            for tm in self.get(f"/jobs/{job_id}/vertices/{vertex['id']}/taskmanagers")["taskmanagers"]:
                if tm["status"] in ("RUNNING", "DEPLOYING", "INITIALIZING"):
                    running.add(tm["taskmanager-id"])
        return running


class ClusterJob(FlinkJob):
    """A job of `settings.rest`'s session cluster: submitted by the job body, watched through REST."""

    def __init__(
        self,
        settings: StreamingJobSettings,
        catalogue: Catalogue = default_catalogue,
        mode: Literal["streaming", "batch"] = "streaming",
    ):
        if not settings.rest:
            raise StreamingJobError("a cluster job needs the JobManager's REST address (settings.rest)")
        super().__init__(settings, catalogue, mode)
        self.rest = FlinkRest(settings.rest)

    def env(self) -> dict[str, str]:
        """The job body's process here is a client: it plans the job, submits it and exits, while the
        cluster's TaskManagers run it. So it runs as a short-lived JVM (SHORT_LIVED_JVM_OPTIONS),
        whatever `settings.jvm_options` asks of a local job."""
        heap = self.settings.batch_jvm_heap if self.mode == "batch" else self.settings.jvm_heap
        return {**super().env(), "JVM_ARGS": f"-Xmx{heap} {SHORT_LIVED_JVM_OPTIONS}"}

    def command(self, restore: Path | None = None) -> list[str]:
        address = self.settings.rest.split("://")[-1].rstrip("/")
        return super().command(restore) + ["--rest", address, "--restart-attempts", str(self.settings.restart_attempts)]

    def submit(self, restore: Path | None = None, timeout: float = 600.0) -> str:
        """Submit the job to the cluster; returns its Flink job id."""
        self.status_path.unlink(missing_ok=True)
        self.prepare_source()
        result = subprocess.run(
            self.command(restore), env=self.env(), cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=timeout
        )
        job_id = self.status().get("job_id")
        if result.returncode != 0 or not job_id:
            raise StreamingJobError(
                f"{self.settings.name}: submission to {self.settings.rest} failed: "
                f"{self.status().get('error')}\n{result.stderr[-3000:]}"
            )
        return job_id

    def start(self, restore: Path | None = None, extra_env: Mapping[str, str] | None = None) -> str:
        """Submits (see submit); stop() cancels the job, keeping its checkpoints for a restart."""
        return self.submit(restore)

    def state(self) -> str:
        job_id = self.status().get("job_id")
        if not job_id:
            return "NOT_STARTED"
        try:
            return self.rest.job(job_id)["state"]
        except JobNotFound:
            return "NOT_FOUND"  # gone with a restarted cluster: start it again from its checkpoint

    def stop(self) -> None:
        job_id = self.status().get("job_id")
        if job_id and self.state() not in TERMINAL | {"NOT_FOUND"}:
            self.rest.cancel(job_id)
            self._wait(lambda: self.state() in TERMINAL, 60, "to be canceled")

    def wait_running(self, timeout: float = 180.0) -> dict:
        """Until every task of the job runs (so that checkpoints can complete)."""

        def running() -> bool:
            details = self.rest.job(self.status()["job_id"])
            if details["state"] in TERMINAL:
                raise StreamingJobError(
                    f"{self.settings.name} ended {details['state']} on the cluster: {self.rest.failure(details['jid'])}"
                )
            return details["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in details["vertices"])

        self._wait(running, timeout, "to run")
        return self.status()

    def run_to_end(self, timeout: float = 600.0) -> dict:
        job_id = self.submit()
        self._wait(lambda: self.state() in TERMINAL, timeout, "to finish")
        if (state := self.state()) != "FINISHED":
            raise StreamingJobError(
                f"{self.settings.name} ({self.mode}) ended {state} on the cluster: {self.rest.failure(job_id)}"
            )
        return {**self.status(), "status": state}

    def health(self, now: float | None = None) -> JobHealth:
        now = now or time.time()
        job_id = self.status().get("job_id")
        base = {"name": self.settings.name, "job_id": job_id, "log_dir": str(self.log_dir)}
        if not job_id:
            return JobHealth(status="NOT_STARTED", healthy=False, **base)
        try:
            state = self.state()
            if state == "NOT_FOUND":
                return JobHealth(status=state, healthy=False, error=f"the cluster does not know job {job_id}", **base)
            checkpoints = self.rest.checkpoints(job_id)
            failure = self.rest.failure(job_id) if state in ("FAILED", "CANCELED") else None
        except StreamingJobError as error:
            return JobHealth(status="UNREACHABLE", healthy=False, error=str(error), **base)
        completed = (checkpoints.get("latest") or {}).get("completed") or {}
        # restarting from a checkpoint is Flink healing itself (a lost TaskManager): counted, not an incident
        healthy = state in SELF_HEALING if self.mode == "streaming" else state == "FINISHED"
        return JobHealth(
            status=state,
            healthy=healthy,
            # restores from a checkpoint (a submission from one counts too), counted by the JobManager as
            # they happen: the `numRestarts` metric reaches REST through the metric fetcher, which stayed
            # stale for minutes after a TaskManager was lost
            restarts=int(checkpoints.get("counts", {}).get("restored", 0)),
            error=failure,
            checkpoint=completed.get("external_path"),
            checkpoint_age_seconds=(round(now - completed["latest_ack_timestamp"] / 1000, 1) if completed else None),
            **base,
            **self.progress(now),
        )

    def _wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if condition():
                return
            time.sleep(0.5)
        raise StreamingJobError(
            f"{self.settings.name}: timed out after {timeout:.0f}s waiting for the job {what} on {self.settings.rest}"
        )


def make_job(
    settings: StreamingJobSettings,
    catalogue: Catalogue = default_catalogue,
    mode: Literal["streaming", "batch"] = "streaming",
) -> FlinkJob:
    """The job on the cluster `settings.rest` names, or on a local mini-cluster."""
    return (ClusterJob if settings.rest else FlinkJob)(settings, catalogue, mode)


@dataclass(frozen=True)
class ClusterSettings:
    root: Path  # configuration, logs, temporary files
    taskmanagers: int = 2
    slots_per_taskmanager: int = 1
    jobmanager_memory: str = "768m"
    taskmanager_memory: str = "1024m"
    flink_python: Path = DEFAULT_FLINK_PYTHON


class StandaloneCluster:
    """A Flink session cluster from the wheel's `bin/`: a JobManager and TaskManagers as processes
    of their own (each in its own process group), on free ports of 127.0.0.1."""

    def __init__(self, settings: ClusterSettings):
        self.settings = settings
        self.root = settings.root
        self.conf_dir, self.log_dir = self.root / "conf", self.root / "log"
        self.rest_port = _free_port()
        self.rest = FlinkRest(self.rest_address)
        self.jobmanager: subprocess.Popen | None = None
        self.taskmanagers: dict[str, subprocess.Popen] = {}  # resource id -> process

    @property
    def rest_address(self) -> str:
        return f"127.0.0.1:{self.rest_port}"

    def flink_home(self) -> Path:
        """The wheel's pyflink folder, which holds bin/, conf/ and lib/."""
        python = Path(self.settings.flink_python)
        if not python.exists():
            raise StreamingJobError(f"the Flink environment {python} is missing: run scripts/setup-flink")
        found = subprocess.run(
            [str(python), "-c", "import os, pyflink; print(os.path.dirname(pyflink.__file__))"],
            capture_output=True,
            text=True,
            check=True,
        )
        return Path(found.stdout.strip())

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        home = self.flink_home()
        self._write_conf(home)
        self.jobmanager = self._daemon(home, "jobmanager", "jobmanager")
        for n in range(1, self.settings.taskmanagers + 1):
            self.start_taskmanager(f"tm-{n}")
        self.wait_for_taskmanagers(self.settings.taskmanagers, timeout)
        return self

    def start_taskmanager(self, resource_id: str) -> None:
        self.taskmanagers[resource_id] = self._daemon(
            self.flink_home(), "taskmanager", resource_id, "-D", f"taskmanager.resource-id={resource_id}"
        )

    def kill_taskmanager(self, resource_id: str) -> None:
        """SIGKILL, as a lost machine: no goodbye to the JobManager."""
        process = self.taskmanagers.pop(resource_id)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def wait_for_taskmanagers(self, count: int, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.jobmanager and self.jobmanager.poll() is not None:
                raise StreamingJobError(f"the JobManager exited (log: {self.log_dir})")
            try:
                if self.rest.overview()["taskmanagers"] == count:
                    return
            except StreamingJobError:
                pass  # not listening yet
            time.sleep(0.5)
        raise StreamingJobError(
            f"the cluster did not come up with {count} TaskManagers in {timeout:.0f}s (log: {self.log_dir})"
        )

    def stop(self) -> None:
        for process in [*self.taskmanagers.values(), self.jobmanager]:
            if process and process_alive(process.pid):
                terminate_group(process.pid)
                process.wait()
        self.taskmanagers.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _daemon(self, home: Path, script: str, name: str, *args: str) -> subprocess.Popen:
        env = {
            **os.environ,
            "FLINK_HOME": str(home),
            "FLINK_CONF_DIR": str(self.conf_dir),
            "FLINK_LOG_DIR": str(self.log_dir),
            "FLINK_IDENT_STRING": name,
        }
        with open(self.log_dir / f"{name}.out", "ab") as out:
            return subprocess.Popen(
                [str(home / "bin" / f"{script}.sh"), "start-foreground", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _write_conf(self, home: Path) -> None:
        import shutil

        import yaml

        if self.conf_dir.exists():
            shutil.rmtree(self.conf_dir)
        shutil.copytree(home / "conf", self.conf_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        conf = yaml.safe_load((home / "conf" / "config.yaml").read_text())
        s = self.settings
        overrides = {
            "jobmanager.bind-host": "127.0.0.1",
            "jobmanager.rpc.address": "127.0.0.1",
            "jobmanager.rpc.port": _free_port(),
            "jobmanager.memory.process.size": s.jobmanager_memory,
            "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.host": "127.0.0.1",
            "taskmanager.numberOfTaskSlots": s.slots_per_taskmanager,
            "taskmanager.memory.process.size": s.taskmanager_memory,
            "taskmanager.memory.managed.fraction": 0.2,
            "rest.address": "127.0.0.1",
            "rest.bind-address": "127.0.0.1",
            "rest.port": self.rest_port,
            "io.tmp.dirs": str(self.root / "tmp"),
            "web.tmpdir": str(self.root / "tmp"),
            # a killed TaskManager is noticed within seconds (its connection drops); a slow one on a
            # busy machine is given time rather than declared lost
            "heartbeat.interval": 2000,
            "heartbeat.timeout": 30000,
            "pekko.ask.timeout": "60 s",
            # a batch backfill runs its stages in one slot, each blocking result needing its sort-shuffle
            # minimum (512 buffers by default): 64 each and 128 MB of buffers let a whole job fit
            "taskmanager.network.sort-shuffle.min-buffers": 64,
            "taskmanager.memory.network.min": "128m",
            "taskmanager.memory.network.max": "128m",
        }
        for key, value in overrides.items():
            _set(conf, key.split("."), value)
        (self.conf_dir / "config.yaml").write_text(yaml.safe_dump(conf))


def _set(tree: dict, path: list[str], value) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
