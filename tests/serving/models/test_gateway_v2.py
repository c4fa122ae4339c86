"""The gateway's `kind: v2` entries routed to the real model server (not a stand-in): entitlements,
request limits and usage records in front of the Open Inference Protocol."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.serving.conftest import GatewayProcess
from tests.serving.models.test_protocol import valid_body


@pytest.fixture(scope="module")
def v2_gateway(tower_server, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gateway_v2")
    config = {
        "model_list": [
            {
                "model_name": "recs-towers",
                "kind": "v2",
                "url": tower_server.url,
                "model": "personalization",
                "region": "eu",
            }
        ],
        "settings": {
            "store": f"sqlite:///{workdir}/gateway.db",
            "rate_limits": "memory",
            "health_interval_s": 1,
            "reload_interval_s": 0.5,
            "connect_timeout_s": 2,
        },
    }
    process = GatewayProcess(config, workdir)
    yield process
    process.stop()


def test_gateway_routes_v2_to_the_model_server(v2_gateway, tower_server):
    import tritonclient.http as triton

    body = valid_body(triton.InferenceServerClient(tower_server.url.removeprefix("http://")))
    direct = httpx.post(f"{tower_server.url}/v2/models/personalization/infer", json=body, timeout=30).json()
    key = v2_gateway.key(models=["recs-towers"], rpm=3)
    auth = {"Authorization": f"Bearer {key}"}
    through = httpx.post(f"{v2_gateway.url}/v2/models/recs-towers/infer", json=body, headers=auth, timeout=30)
    assert through.status_code == 200, through.text
    assert through.json()["outputs"] == direct["outputs"] and through.json()["model_version"] == "1"
    metadata = httpx.get(f"{v2_gateway.url}/v2/models/recs-towers", headers=auth, timeout=30).json()
    assert metadata["name"] == "personalization" and metadata["versions"] == ["1"]
    bad = httpx.post(
        f"{v2_gateway.url}/v2/models/recs-towers/infer",
        headers=auth,
        timeout=30,
        json={"inputs": [{"name": "user_id", "datatype": "FP99", "shape": [1], "data": [1]}]},
    )
    assert bad.status_code == 400 and "unknown datatype" in bad.text  # the server's 4xx reaches the client
    limited = httpx.post(f"{v2_gateway.url}/v2/models/recs-towers/infer", json=body, headers=auth, timeout=30)
    assert limited.status_code == 429  # the key's 3 requests a minute are spent
    assert httpx.post(f"{v2_gateway.url}/v2/models/recs-towers/infer", json=body, timeout=30).status_code == 401
    other = v2_gateway.key(models=["something-else"])
    assert (
        httpx.post(
            f"{v2_gateway.url}/v2/models/recs-towers/infer",
            json=body,
            timeout=30,
            headers={"Authorization": f"Bearer {other}"},
        ).status_code
        == 403
    )
    deadline = time.time() + 30
    while True:  # usage is written asynchronously
        rows = [r for r in v2_gateway.store.usage_report(group_by=("model", "status")) if r["model"] == "recs-towers"]
        if sum(r["requests"] for r in rows) >= 3 or time.time() > deadline:
            break
        time.sleep(0.2)
    # the infer and the metadata call answered, the bad tensor refused by the server
    assert {r["status"]: r["requests"] for r in rows if r["status"] in (200, 400)} == {200: 2, 400: 1}
