"""Circuits that tell a backend's fault from a client's: a gateway process in front of a v2 backend that
fails the way other v2 servers do on hostile inputs. The backend is a stand-in (a small ASGI app): the
platform's own model server answers these inputs with a 4xx now, so it cannot show a backend that
blames the request with a 500, or one that crashes on one client's inputs."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import uvicorn

from tests.serving.conftest import GatewayProcess, free_port, read_body

HOSTILE_SHAPE = [0, 2**62, 2**62]  # issue 42: passed the gateway's schema and made the server answer 500


async def fragile_v2_server(scope, receive, send):
    """A v2 backend (as an older model server or a KServe predictor answers): a 500 naming the input for
    a shape it cannot reshape; an opaque 500 (a crash) for a negative value; the sum otherwise."""
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    status, answer = 200, {"ready": True}
    if scope["path"].endswith("/infer"):
        tensor = json.loads(body)["inputs"][0]
        if any(d > 2**31 for d in tensor["shape"]):
            shape = tuple(tensor["shape"])
            status, answer = 500, {"error": f"input 'x': cannot reshape array of size 0 into shape {shape}"}
        elif any(v < 0 for v in tensor["data"]):
            status, answer = 500, {"error": "Traceback (most recent call last): worker crashed"}
        else:
            output = {"name": "sum", "datatype": "FP32", "shape": [1], "data": [sum(tensor["data"])]}
            answer = {"model_name": "m", "outputs": [output]}
    payload = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture(scope="module")
def fragile_gateway(tmp_path_factory):
    port = free_port()
    backend = uvicorn.Server(uvicorn.Config(fragile_v2_server, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=backend.run, daemon=True)
    thread.start()
    while not backend.started:
        time.sleep(0.05)
    workdir = tmp_path_factory.mktemp("fragile_gateway")
    config = {
        "model_list": [{"model_name": "fragile", "kind": "v2", "url": f"http://127.0.0.1:{port}", "model": "m"}],
        "settings": {"store": f"sqlite:///{workdir}/gateway.db", "health_interval_s": 1, "circuit_open_s": 60},
    }
    gateway = GatewayProcess(config, workdir)
    yield gateway
    gateway.stop()
    backend.should_exit = True
    thread.join(10)


def infer(gateway: GatewayProcess, key: str, shape: list[int], data: list[float]) -> httpx.Response:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{gateway.url}/v2/models/fragile/infer", json=body, headers=headers, timeout=30)


def test_a_backend_500_naming_the_input_is_the_clients_400_and_trips_nothing(fragile_gateway):
    """Before: three such requests from one key opened the circuit and every key got 503
    no_backend_available for the next circuit_open_s."""
    hostile, other = fragile_gateway.key(), fragile_gateway.key()
    for _ in range(5):
        answer = infer(fragile_gateway, hostile, HOSTILE_SHAPE, [])
        assert answer.status_code == 400 and "input 'x'" in answer.json()["error"], answer.text
    served = infer(fragile_gateway, other, [2], [1.0, 2.0])
    assert served.status_code == 200 and served.json()["outputs"][0]["data"] == [3.0], served.text
    state = fragile_gateway.backends("fragile")
    assert [s["circuit_open"] for s in state.values()] == [0.0] and [s["failures"] for s in state.values()] == [0.0]


def test_one_key_crashing_the_backend_opens_only_its_own_circuit(fragile_gateway):
    """A key whose inputs crash the backend (an opaque 500) spends its own failure budget: after
    circuit_failures in a row it is refused alone, and other keys are still served."""
    crashing, other = fragile_gateway.key(), fragile_gateway.key()
    codes = [infer(fragile_gateway, crashing, [1], [-1.0]) for _ in range(5)]
    assert [c.status_code for c in codes] == [502, 502, 502, 503, 503], [c.text for c in codes]
    assert codes[-1].json()["error"]["code"] == "key_circuit_open"
    served = infer(fragile_gateway, other, [2], [1.0, 2.0])
    assert served.status_code == 200, served.text
    assert [s["circuit_open"] for s in fragile_gateway.backends("fragile").values()] == [0.0]
