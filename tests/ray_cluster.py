"""A real two-node Ray cluster for the tests: `ray start --head` and a second node joined with
`ray start --address`, each its own process tree with its own CPUs, a small object store and its own
temp folder, as two machines would be (`running_cluster`), stopped by its own process ids, never with
`ray stop` (other Ray instances may run on this machine).

The second node can be killed mid-job (`kill_worker`: SIGKILL of its whole process tree, as when a
machine is lost) and replaced (`start_worker`). The head's health checks are tightened so that the
cluster notices a lost node in about two seconds instead of Ray's default fifteen.
Token authentication is on for the nodes and the tests' driver, with this machine's token
(`~/.ray/auth_token`, generated if absent). Not off: an in-process `ray.init` earlier in the same
test session switches the driver to token mode for good (it sets RAY_AUTH_MODE=token and keeps the
token), and a driver in token mode could run tasks on a cluster without it but not create actors
(the Ray Train controller was cancelled before it started). So the mode stays on after the cluster
stops, as it would after any local `ray.init`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
from ray._private.authentication.authentication_token_setup import _enable_token_auth

RAY = str(Path(sys.executable).with_name("ray"))
NODE_CPUS = 2
OBJECT_STORE_BYTES = 120 * 1024 * 1024
WORKER_RESOURCE = "node2"  # custom resource of the second node
HEAD_ENV = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "5",
    "RAY_health_check_timeout_ms": "2000",
}
START_ATTEMPTS = 3  # `ray start` gives a raylet 30 s to register; a saturated CI machine can miss that


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RayCluster:
    root: Path
    port: int = 0
    head: subprocess.Popen | None = None
    worker: subprocess.Popen | None = None
    workers_started: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _env(self, extra: dict | None = None) -> dict:
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0", **(extra or {})}

    def _start(self, args: list[str], temp_dir: Path, log: str, extra_env: dict | None = None) -> subprocess.Popen:
        temp_dir.mkdir(parents=True, exist_ok=True)
        common = [
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            str(NODE_CPUS),
            "--num-gpus",
            "0",
            "--object-store-memory",
            str(OBJECT_STORE_BYTES),
            "--temp-dir",
            str(temp_dir),
            "--dashboard-agent-listen-port",
            str(_free_port()),
            "--metrics-export-port",
            str(_free_port()),
        ]
        return subprocess.Popen(
            [RAY, "start", *args, *common],
            env=self._env(extra_env),
            start_new_session=True,
            stdout=open(self.root / log, "ab"),
            stderr=subprocess.STDOUT,
        )

    def start_head(self) -> None:
        for attempt in range(START_ATTEMPTS):
            self.port = _free_port()
            self.head = self._start(
                [
                    "--head",
                    "--port",
                    str(self.port),
                    "--include-dashboard",
                    "false",
                    "--ray-client-server-port",
                    str(_free_port()),
                    "--resources",
                    '{"head": 1}',
                ],
                self.root / f"head{attempt}",
                f"head{attempt}.log",
                HEAD_ENV,
            )
            if self._started(self.head, f"head{attempt}.log", last=attempt == START_ATTEMPTS - 1):
                return

    def start_worker(self) -> None:
        """Join a (new) second node with its own temp folder; `wait_for_nodes` sees it in the cluster."""
        for attempt in range(START_ATTEMPTS):
            self.workers_started += 1
            log = f"worker{self.workers_started}.log"
            self.worker = self._start(
                ["--address", self.address, "--resources", json.dumps({WORKER_RESOURCE: 1})],
                self.root / f"node{self.workers_started}",
                log,
            )
            if self._started(self.worker, log, last=attempt == START_ATTEMPTS - 1):
                return

    def kill_worker(self) -> None:
        """SIGKILL the second node's whole process tree (raylet, object store, its workers)."""
        _kill_tree(self.worker)
        self.worker = None

    def _started(self, process: subprocess.Popen, log: str, last: bool, timeout: float = 180) -> bool:
        """Whether the node came up; False (its processes killed) after a start-up time-out unless
        this was the `last` attempt, which raises with the log's end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = (self.root / log).read_text(errors="replace")
            if "Ray runtime started" in text:
                return True
            if process.poll() is not None:
                _kill_tree(process)
                if "timed out during startup" in text and not last:
                    return False
                raise RuntimeError(f"ray start exited: {text[-3000:]}")
            time.sleep(0.5)
        raise TimeoutError(f"ray start ({log}) did not start in {timeout}s")


def wait_for_nodes(count: int, timeout: float = 120) -> list[dict]:
    """The live nodes once there are `count` (this process's Ray must be connected to the cluster)."""
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [n for n in ray.nodes() if n["Alive"]]
        if len(alive) == count:
            return alive
        time.sleep(0.5)
    raise TimeoutError(f"the Ray cluster did not reach {count} live nodes in {timeout}s")


def _stop(cluster: RayCluster) -> None:
    for process in (cluster.worker, cluster.head):
        _kill_tree(process)


def _kill_tree(process: subprocess.Popen | None) -> None:
    if process is None:
        return
    try:
        parent = psutil.Process(process.pid)
        tree = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    try:  # the node's processes share the session `ray start` began, including re-parented ones
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)
    process.wait(timeout=30)


@contextmanager
def running_cluster():
    """A head and a second node for the duration of a block, then both stopped."""
    root = Path(tempfile.mkdtemp(prefix="rayc", dir="/tmp"))  # short: Ray's socket paths live under it
    cluster = RayCluster(root)
    subprocess.run([RAY, "get-auth-token", "--generate"], check=True, capture_output=True, env=cluster._env())
    _enable_token_auth()  # what ray.init does for a local cluster: RAY_AUTH_MODE=token, RayConfig reloaded
    try:
        cluster.start_head()
        cluster.start_worker()
        yield cluster
    finally:
        _stop(cluster)
