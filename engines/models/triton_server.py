"""NVIDIA Triton Inference Server over an exported model repository (engines/models/model_export.py), as a child
process: the CPU server of the `nvidia-pytriton` wheel, installed in `.venv-triton` by scripts/setup-triton.
That server has the Python backend only, so it starts with the repository's Python-backend configuration
(`--model-config-name python_cpu`). Plain Python, no Dagster; used by the tests and
benchmarks/online_serving.py to load what the export writes in a real Triton.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from engines.models.model_export import PYTHON_CONFIG_NAME

TRITON_VENV = Path(__file__).resolve().parents[2] / ".venv-triton"


def server_folder(venv: Path = TRITON_VENV) -> Path:
    """The wheel's `pytriton/tritonserver` (bin/tritonserver, backends/)."""
    found = sorted(venv.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not found or not (found[0] / "bin" / "tritonserver").exists():
        raise FileNotFoundError(f"no Triton server in {venv}: run scripts/setup-triton")
    if not (found[0] / "backends" / "python" / "triton_python_backend_stub").exists():
        raise FileNotFoundError(f"the Python backend in {found[0]} has no stub: run scripts/setup-triton")
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TritonServer:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"  # as tritonclient takes it

    def stop(self) -> None:
        _stop(self.process)


@contextmanager
def running_triton(
    repository: Path, log: Path, env: dict | None = None, timeout: float = 180, venv: Path = TRITON_VENV
) -> Iterator[TritonServer]:
    """Triton on free ports over `repository` until the block ends; ready once every model loaded (a model
    that fails to load fails the start, with the log's end)."""
    folder = server_folder(venv)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [
        str(folder / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={folder / 'backends'}",
        f"--model-config-name={PYTHON_CONFIG_NAME}",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false",
        "--strict-readiness=true",
        "--exit-on-error=true",
    ]
    # The Python backend's stub embeds the system's libpython in isolated mode (PYTHONPATH is ignored) and
    # takes its prefix from the `python3` found on PATH: .venv-triton's, whose numpy (<2) is the one the stub
    # was built against (under numpy 2 its outputs arrive empty). model.py then adds the exporting
    # environment's site-packages for torch (config parameter `site_packages`).
    path = os.pathsep.join([str(venv / "bin"), os.environ.get("PATH", "")])
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PATH": path, **(env or {})},
            start_new_session=True,
        )
    server = TritonServer(process, http_port, grpc_port, log)
    try:
        _wait_ready(server, timeout)
        yield server
    finally:
        server.stop()


def _wait_ready(server: TritonServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"tritonserver exited with {server.process.returncode}: {_tail(server.log)}")
        try:
            if httpx.get(f"http://{server.url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"tritonserver not ready in {timeout}s: {_tail(server.log)}")


def _tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:]


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's session, SIGKILL if it does not exit; then any Python-backend stub left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            continue
