"""Real backends for the gateway tests: the platform's small language model, trained once per session
by its Dagster asset on simulated data and served by vLLM (CPU build, its own environment); gateways run
as separate processes. The vLLM servers belong to the packages that use them (gateway/, llm/), so only
one set runs at a time: each takes about 2.5 GB, and two sets with the rest of the suite fill the machine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from dagster import AssetSelection, DagsterInstance, materialize

from assets import all_assets
from assets.ingestion import warehouse_key
from assets.llm import GATEWAY_LLM, GATEWAY_LLM_DRAFT, gateway_llm_dir, gateway_llm_draft_dir
from engines.models.registry import ModelRegistry
from feature_defs.sources import chat_messages, items
from orchestration.profiles import PROJECT_ROOT, resources_for
from serving.gateway.store import GatewayStore
from serving.gateway.vllm_process import CPU_ENV
from tests.conftest import FIRST_DAY, built_once, copy_registry, run_folder, run_pipeline, simulate

VLLM_PYTHON = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"
MODEL_NAME = "gateway-llm"
EMBEDDING_MODEL = "gateway-llm-embed"
ADMIN_KEY = "test-admin-key"
STARTUP_TIMEOUT_S = 900  # vLLM starts in tens of seconds, more while other suites load the two cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[:4]} exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy after {timeout} s:\n{log.read_text()[-4000:]}")


def stop_process(process: subprocess.Popen, timeout: float = 60) -> int:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


def trained_gateway_llm(tmp_path_factory) -> Path:
    """A lake with the gateway LLM asset materialized through Dagster on two simulated days (few steps:
    tests need a real model in Hugging Face format, not a good one), registered in its registry as v1.
    Built once per run (`built_once`), beside the xdist workers' folders: tests/serving's
    `gateway_llm_lake` copies it and tests/assets/test_embeddings.py's vision captioner loads the model
    from its registry. Read-only."""
    return built_once(run_folder(tmp_path_factory) / "gateway_llm_lake", build_gateway_llm_lake)


def build_gateway_llm_lake(data_dir: Path) -> None:
    simulate(data_dir, days=2)
    run_pipeline(
        data_dir,
        FIRST_DAY,
        FIRST_DAY.replace(day=FIRST_DAY.day + 1),
        AssetSelection.assets(warehouse_key(chat_messages), warehouse_key(items)),
    )
    materialize_llm_assets(data_dir, GATEWAY_LLM)


@pytest.fixture(scope="session")
def gateway_llm_lake(tmp_path_factory) -> Path:
    """This session's copy of the run's gateway LLM lake (`trained_gateway_llm`), its registry its own:
    the draft model, deployments and promotions under test write to it."""
    import shutil

    shared = trained_gateway_llm(tmp_path_factory)
    data_dir = tmp_path_factory.mktemp("llm_lake") / "lake"
    shutil.copytree(shared, data_dir, ignore=lambda folder, names: ["registry"] if Path(folder) == shared else [])
    copy_registry(shared / "registry", data_dir / "registry")
    return data_dir


def materialize_llm_assets(data_dir: Path, *keys, steps: int = 40) -> None:
    config = {"config": {"steps": steps, "context": 64}}
    ops = {"models__gateway_llm": config, "models__gateway_llm_draft": config}
    result = materialize(
        all_assets,
        selection=AssetSelection.assets(*keys),
        resources=resources_for("local", data_dir=str(data_dir)),
        instance=DagsterInstance.ephemeral(),
        run_config={"ops": {k.to_python_identifier(): ops[k.to_python_identifier()] for k in keys}},
    )
    assert result.success


@pytest.fixture(scope="session")
def gateway_llm_path(gateway_llm_lake) -> Path:
    return gateway_llm_dir(gateway_llm_lake)


@pytest.fixture(scope="session")
def gateway_llm_draft_path(gateway_llm_lake) -> Path:
    """The draft model, trained by its asset on the same lake after the target."""
    materialize_llm_assets(gateway_llm_lake, GATEWAY_LLM_DRAFT)
    return gateway_llm_draft_dir(gateway_llm_lake)


ROLLED, DRAFTED, NGRAM = "llm-rolled", "llm-draft-spec", "llm-ngram-spec"


@pytest.fixture(scope="session")
def llm_registry(gateway_llm_lake, gateway_llm_draft_path) -> ModelRegistry:
    registry = ModelRegistry.local(gateway_llm_lake / "registry")
    # pin the aliases the deployments follow: the promotion under test moves them, not the training checks
    registry.set_alias("gateway_llm", "champion", "1", who="test", reason="deployment under test")
    registry.set_alias("gateway_llm_draft", "champion", "1", who="test", reason="deployment under test")
    return registry


@dataclass
class VllmServer:
    name: str
    region: str
    command: list[str]
    env: dict
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*self.command, "--port", str(self.port)],
            env=self.env,
            stdout=self.log.open("a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self) -> None:
        wait_healthy(f"{self.url}/health", self.process, self.log)

    def kill(self) -> None:
        """Abrupt death, as a crashed or preempted backend."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def vllm_server(name: str, region: str, model_dir: Path, served_name: str, logs: Path, *extra: str) -> VllmServer:
    if not VLLM_PYTHON.exists():
        raise RuntimeError(f"{VLLM_PYTHON} missing: run scripts/setup-vllm")
    command = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        "32",
        "--dtype",
        "float32",
        "--enforce-eager",  # no graph compile at start: the tests' model is tiny
        *extra,
    ]
    env = {**os.environ, **CPU_ENV}
    return VllmServer(name, region, command, env, logs / f"vllm-{name}.log")


def gateway_config(
    backends: dict[str, VllmServer],
    model_dir: Path,
    store: str,
    rate_limits: str = "memory",
    prefix: str = "mlplane:test",
    extra_models: list[dict] = (),
) -> dict:
    chat = [
        {
            "model_name": MODEL_NAME,
            "url": backends[r].url,
            "model": MODEL_NAME,
            "region": r,
            "capacity": 64,
            "tokenizer": str(model_dir),
            "max_tokens": 32,
        }
        for r in ("eu", "us")
    ]
    embed = [
        {
            "model_name": EMBEDDING_MODEL,
            "url": backends["embed"].url,
            "model": EMBEDDING_MODEL,
            "region": "eu",
            "tokenizer": str(model_dir),
        }
    ]
    return {
        "model_list": [*chat, *embed, *extra_models],
        "settings": {
            "store": store,
            "rate_limits": rate_limits,
            "rate_limit_prefix": prefix,
            "max_body_bytes": 65_536,
            "key_cache_s": 0,
            "health_interval_s": 1,
            "reload_interval_s": 0.5,
            "connect_timeout_s": 2,
            "circuit_open_s": 5,
        },
    }


class GatewayProcess:
    """`python -m serving.gateway` in its own process, as it runs in production."""

    def __init__(self, config: dict, workdir: Path):
        self.config_path = workdir / "gateway.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.config = config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "gateway.log"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serving.gateway",
                "--config",
                str(self.config_path),
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            env={**os.environ, "MLPLANE_GATEWAY_ADMIN_KEY": ADMIN_KEY},
            cwd=PROJECT_ROOT,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_healthy(f"{self.url}/health", self.process, self.log, timeout=120)
        self.store = GatewayStore(config["settings"]["store"])

    def rewrite(self, config: dict) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config))
        tmp.replace(self.config_path)  # atomic: the watcher never reads half a file
        self.config = config

    def admin(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(
            method, self.url + path, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30, **kwargs
        )

    def metrics(self) -> str:
        """/metrics with the admin key (anonymous callers are refused: it names backends and models)."""
        response = self.admin("GET", "/metrics")
        assert response.status_code == 200, response.text
        return response.text

    def backends(self, model: str = MODEL_NAME) -> dict[str, dict[str, float]]:
        """Per backend URL of `model`: in_flight, circuit_open and failures (attempts booked as failed)."""
        from prometheus_client.parser import text_string_to_metric_families

        states: dict[str, dict[str, float]] = {}
        names = {
            "mlplane_gateway_backend_in_flight": "in_flight",
            "mlplane_gateway_backend_circuit_open": "circuit_open",
        }
        failures: dict[str, float] = {}
        for family in text_string_to_metric_families(self.metrics()):
            for sample in family.samples:
                if sample.name in names and sample.labels["model"] == model:
                    states.setdefault(sample.labels["backend"], {})[names[sample.name]] = sample.value
                if sample.name == "mlplane_gateway_backend_requests_total" and sample.labels["outcome"] == "failure":
                    failures[sample.labels["backend"]] = sample.value
        for url, state in states.items():
            state["failures"] = failures.get(url, 0.0)
        return states

    def key(self, **fields) -> str:
        response = self.admin("POST", "/admin/keys", json={"owner": "tester", "team": "qa", **fields})
        assert response.status_code == 201, response.text
        return response.json()["key"]

    def stop(self) -> int:
        return stop_process(self.process)


async def read_body(receive) -> bytes:
    """An ASGI request's whole body."""
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


def numeric_inputs(body: bytes) -> bool:
    try:
        inputs = json.loads(body)["inputs"]
        return all(isinstance(i["data"], list) and all(type(v) in (int, float) for v in i["data"]) for i in inputs)
    except (ValueError, KeyError, TypeError):
        return False


async def v2_model_server(scope, receive, send):
    """A stand-in for the online model server (built in another part of the platform): Open Inference
    Protocol v2 health, metadata and an `adder` model that sums each input's data."""
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    path, status = scope["path"], 200
    if path == "/v2/health/ready":
        answer = {"ready": True}
    elif path == "/v2/models/adder":
        answer = {"name": "adder", "platform": "python", "inputs": [{"name": "x", "datatype": "FP32"}]}
    elif path == "/v2/models/broken/infer":  # a backend failing with internals in its error text
        status, answer = 500, {"error": "Traceback: secret-internal-detail at /srv/model.py"}
    elif path == "/v2/models/adder/infer" and not numeric_inputs(body):  # as a real server refuses them
        status, answer = 400, {"error": "each input's data must be a list of numbers"}
    elif path == "/v2/models/adder/infer":
        inputs = json.loads(body)["inputs"]
        answer = {
            "model_name": "adder",
            "outputs": [
                {"name": f"sum_{i['name']}", "datatype": "FP32", "shape": [1], "data": [sum(i["data"])]} for i in inputs
            ],
        }
    else:
        status, answer = 404, {"error": f"no route {path}"}
    payload = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


def chat_stream(gateway: GatewayProcess, key: str, body: dict):
    """A streamed chat completion through `gateway` with `key`: a context manager giving the response."""
    return httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=60, headers={"Authorization": f"Bearer {key}"}
    )


class CuttingProxy:
    """A TCP proxy in front of a real backend that drops the connection once `cut_after` bytes of the
    backend's answer have passed: the network failing under a request, at a chosen point. With `hang`,
    it keeps the connection open and silent instead (a backend that hangs mid-stream). `delay_s` holds
    back each 256-byte piece of the answer: a slow network."""

    def __init__(self, upstream_port: int, cut_after: float, hang: bool = False, delay_s: float = 0.0):
        self.upstream_port, self.cut_after, self.hang, self.delay_s = upstream_port, cut_after, hang, delay_s
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, client_reader, client_writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:  # the backend is down (a test killed it): the link drops, as a TCP proxy's does
            client_writer.transport.abort()
            return
        first = await client_reader.read(65536)
        cut_after = float("inf") if first.startswith(b"GET /health") else self.cut_after  # probes pass
        upstream_writer.write(first)

        async def requests():
            while data := await client_reader.read(65536):
                upstream_writer.write(data)
                await upstream_writer.drain()

        async def answers():
            passed = 0
            while data := await upstream_reader.read(256):
                await asyncio.sleep(self.delay_s)
                if passed + len(data) > cut_after:
                    data = data[: int(cut_after - passed)]
                passed += len(data)
                if data:
                    client_writer.write(data)
                    await client_writer.drain()
                if passed >= cut_after:
                    return

        forward = asyncio.ensure_future(requests())
        await answers()
        if self.hang and cut_after != float("inf"):
            await asyncio.sleep(3600)  # silent until the gateway gives up (or the proxy closes)
        forward.cancel()
        for writer in (client_writer, upstream_writer):
            writer.transport.abort()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
