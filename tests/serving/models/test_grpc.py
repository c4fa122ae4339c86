"""The Open Inference Protocol over gRPC: tritonclient.grpc unchanged against the same server core."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from serving.models.config import ServerConfig
from tests.serving.models.conftest import ADMIN_KEY, TOWER_ENTRIES, free_port, start_server
from tests.serving.models.test_protocol import tower_inputs

ADMIN_METADATA = {"authorization": f"Bearer {ADMIN_KEY}"}
DATATYPE = {np.dtype(np.int64): "INT64", np.dtype(np.float64): "FP64", np.dtype(object): "BYTES"}


@pytest.fixture(scope="module")
def grpc_server(tower_registry, tmp_path_factory):
    _, root = tower_registry
    config = ServerConfig(
        registry_root=str(root / "registry"),
        lake_root=str(tmp_path_factory.mktemp("grpc_lake")),
        models=TOWER_ENTRIES,
        poll_interval_s=0.2,
        feature_log_sample=0.0,
    )
    port = free_port()
    running = start_server(config, grpc_port=port)
    yield running, f"127.0.0.1:{port}"
    running.stop()


def infer_inputs(module, arrays):
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), DATATYPE[array.dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_tritonclient_grpc_matches_rest(grpc_server):
    running, address = grpc_server
    client = triton_grpc.InferenceServerClient(address)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("personalization")
    assert "model_repository" in client.get_server_metadata(as_json=True)["extensions"]
    metadata = client.get_model_metadata("personalization", as_json=True)
    assert metadata["versions"] == ["1"] and {i["name"] for i in metadata["inputs"]} >= {"user_id"}
    arrays = tower_inputs(
        triton_http.InferenceServerClient(running.url.removeprefix("http://")).get_model_metadata("personalization"),
        np.random.default_rng(3),
    )
    over_grpc = client.infer("personalization", infer_inputs(triton_grpc, arrays))
    rest = triton_http.InferenceServerClient(running.url.removeprefix("http://")).infer(
        "personalization", infer_inputs(triton_http, arrays)
    )
    assert over_grpc.get_response(as_json=True)["model_version"] == "1"
    np.testing.assert_array_equal(over_grpc.as_numpy("user_vector"), rest.as_numpy("user_vector"))
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"]: m["state"] for m in index} == {"personalization": "READY", "personalization-challenger": "READY"}
    client.unload_model("personalization-challenger", headers=ADMIN_METADATA)
    assert not client.is_model_ready("personalization-challenger")
    client.load_model("personalization-challenger", headers=ADMIN_METADATA)
    assert client.is_model_ready("personalization-challenger")
    metrics = __import__("httpx").get(f"{running.url}/metrics").text
    assert 'mlplane_model_requests_total{model="personalization",protocol="grpc",version="1"}' in metrics


def test_grpc_errors_carry_the_protocol_status(grpc_server):
    _, address = grpc_server
    client = triton_grpc.InferenceServerClient(address)
    user = triton_grpc.InferInput("user_id", [2], "INT64")
    user.set_data_from_numpy(np.array([1, 2], np.int64))
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as unknown:
        client.infer("nope", [user])
    assert unknown.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException, match="needs input") as missing:
        client.infer("personalization", [user])
    assert missing.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="no version '7'"):
        client.infer("personalization", [user], model_version="7")


def test_grpc_control_calls_need_the_admin_key(grpc_server):
    _, address = grpc_server
    client = triton_grpc.InferenceServerClient(address)
    for headers, code in (
        (None, "StatusCode.UNAUTHENTICATED"),
        ({"authorization": "Bearer a-guess"}, "StatusCode.PERMISSION_DENIED"),
        ({"authorization": f"Basic {ADMIN_KEY}"}, "StatusCode.UNAUTHENTICATED"),
    ):
        for call in (client.unload_model, client.load_model):
            with pytest.raises(InferenceServerException) as refused:
                call("personalization-challenger", headers=headers)
            assert refused.value.status() == code, (call, headers)
    assert client.is_model_ready("personalization-challenger")  # nothing was unloaded


def test_grpc_bad_inputs_are_invalid_argument_not_unknown(grpc_server):
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    _, address = grpc_server
    stub = pb_grpc.GRPCInferenceServiceStub(__import__("grpc").insecure_channel(address))
    tensor = pb.ModelInferRequest.InferInputTensor
    bad = {
        "FP16 typed contents": tensor(name="user_id", datatype="FP16", shape=[1]),
        "huge empty BYTES": tensor(name="user_id", datatype="BYTES", shape=[0, 2**62, 2**62]),
    }
    for what, given in bad.items():
        with pytest.raises(__import__("grpc").RpcError) as refused:
            stub.ModelInfer(pb.ModelInferRequest(model_name="personalization", inputs=[given]))
        assert refused.value.code().name in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"), (what, refused.value)
