"""The gateway's backends: two chat backends and one embedding backend on vLLM, and a gateway over them.
Package-scoped, so these vLLM servers stop before tests/serving/llm starts its own (the machine's
memory holds one set at a time)."""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn

from tests.serving.conftest import (
    EMBEDDING_MODEL,
    MODEL_NAME,
    GatewayProcess,
    VllmServer,
    free_port,
    gateway_config,
    stop_process,
    v2_model_server,
    vllm_server,
)


@pytest.fixture(scope="package")
def vllm_backends(gateway_llm_path, tmp_path_factory) -> dict[str, VllmServer]:
    """Two chat backends (regions eu and us) and one embedding backend (the same model, pooling runner)."""
    logs = tmp_path_factory.mktemp("vllm_logs")
    servers = {
        "eu": vllm_server("eu", "eu", gateway_llm_path, MODEL_NAME, logs),
        "us": vllm_server("us", "us", gateway_llm_path, MODEL_NAME, logs),
        "embed": vllm_server(
            "embed", "eu", gateway_llm_path, EMBEDDING_MODEL, logs, "--runner", "pooling", "--convert", "embed"
        ),
    }
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait()
        yield servers
    finally:
        for server in servers.values():
            if server.process is not None:
                stop_process(server.process)


@pytest.fixture(scope="package")
def v2_backend() -> str:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(v2_model_server, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.1)
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="package")
def gateway(vllm_backends, gateway_llm_path, v2_backend, tmp_path_factory) -> GatewayProcess:
    """The embedded default: SQLite keys and usage, in-process rate limits."""
    workdir = tmp_path_factory.mktemp("gateway")
    v2 = [{"model_name": name, "kind": "v2", "url": v2_backend, "region": "eu"} for name in ("adder", "broken")]
    config = gateway_config(vllm_backends, gateway_llm_path, f"sqlite:///{workdir}/gateway.db", extra_models=v2)
    process = GatewayProcess(config, workdir)
    yield process
    process.stop()
