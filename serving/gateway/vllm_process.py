"""vLLM OpenAI servers as child processes (CPU build in `.venv-vllm`, or any vLLM on a GPU host): the
command line for a model folder with optional speculative decoding, readiness, load and stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"
# CPU build settings: a 1 GiB KV cache per server, no thread pinning (the cores are shared), the model
# run inside the engine process (vLLM's CPU build otherwise spawns a worker process, one more torch
# start per server: unpinned threads need no process of their own; a no-op on GPU hosts), offline
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def speculative_config(
    method: str, num_tokens: int, draft_dir: Path | None = None, lookup_max: int = 3, lookup_min: int = 1
) -> str:
    """vLLM's --speculative-config JSON. Both methods run on vLLM 0.32's CPU build (its CPU model
    runner inherits the GPU runner's drafters; checked with a draft model and with n-grams)."""
    if method == "draft_model":
        return json.dumps({"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": num_tokens})
    return json.dumps(
        {
            "method": "ngram",
            "num_speculative_tokens": num_tokens,
            "prompt_lookup_max": lookup_max,
            "prompt_lookup_min": lookup_min,
        }
    )


@dataclass
class VllmProcess:
    model_dir: Path
    served_name: str
    log: Path
    extra_args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    python: Path = DEFAULT_PYTHON
    pid: int | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "256",
            "--max-num-seqs",
            "32",
            "--dtype",
            "float32",
            *self.extra_args,
        ]

    def start(self) -> VllmProcess:
        if not self.python.exists():
            raise RuntimeError(f"{self.python} missing: run scripts/setup-vllm")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(),
            env={**os.environ, **CPU_ENV},
            stdout=self.log.open("a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.process.pid
        return self

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            os.kill(self.pid, 0)
            return True
        except (OSError, TypeError):
            return False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if not self.alive():
                raise RuntimeError(f"vLLM for {self.model_dir} exited:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM for {self.model_dir} not ready after {timeout_s} s:\n{self.log_tail()}")

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters and gauges, summed over label sets."""
        from prometheus_client.parser import text_string_to_metric_families

        totals: dict[str, float] = {}
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    def busy(self) -> int:
        """Requests running or waiting in the engine."""
        metrics = self.metrics()
        return int(metrics.get("vllm:num_requests_running", 0) + metrics.get("vllm:num_requests_waiting", 0))

    def drain(self, timeout_s: float, settle_s: float = 0.5) -> bool:
        """Waits until the engine has had nothing to do for `settle_s`; False on timeout."""
        deadline, idle_since = time.time() + timeout_s, None
        while time.time() < deadline:
            try:
                idle = self.busy() == 0
            except httpx.HTTPError:
                return True  # gone: nothing left to finish
            idle_since = (idle_since or time.time()) if idle else None
            if idle_since and time.time() - idle_since >= settle_s:
                return True
            time.sleep(0.1)
        return False

    def stop(self, timeout_s: float = 60) -> None:
        if not self.alive():
            return
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.time() + timeout_s
        while self.alive() and time.time() < deadline:
            if self.process is not None:
                try:
                    self.process.wait(0.2)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.2)
        if self.alive():
            os.killpg(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text()[-chars:] if self.log.exists() else "(no log)"
