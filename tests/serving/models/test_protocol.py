"""The Open Inference Protocol v2 over REST, driven by tritonclient itself (binary and JSON tensors),
against real registry models; every client mistake is a 4xx naming it."""

from __future__ import annotations

import httpx
import numpy as np
import polars as pl
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from ml.personalization import PersonalizationModel
from tests.serving.models.conftest import ADMIN

USERS = 3


def tower_inputs(metadata: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random valid values for every user-tower input the model's metadata lists."""
    arrays = {}
    for spec in metadata["inputs"]:
        name, datatype = spec["name"], spec["datatype"]
        if name == "item_ids":
            continue
        if datatype == "INT64" and len(spec["shape"]) == 1:
            arrays[name] = rng.integers(0, 50, USERS).astype(np.int64)
        elif datatype == "INT64":
            history = rng.integers(0, 20, (USERS, 4)).astype(np.int64)
            history[0, 2:] = -1  # padding
            arrays[name] = history
        elif datatype == "FP64":
            arrays[name] = rng.normal(size=USERS)
        else:
            arrays[name] = np.array([b"eu", b"us", b"never-seen"], dtype=object)
    return arrays


def expected_vectors(registry, version: str, arrays: dict[str, np.ndarray], tmp_path) -> np.ndarray:
    """The registry's model, loaded apart from the server, on the same inputs."""
    model = PersonalizationModel.load(registry.load("personalization", version, tmp_path / f"v{version}"))
    spec = model.spec.user
    columns = {c: arrays[c].tolist() for c in [spec.id_column, *spec.numeric]}
    columns |= {c: [v.decode() for v in arrays[c]] for c in spec.categorical}
    columns |= {c: [[i for i in row if i >= 0] for row in arrays[c].tolist()] for c in spec.histories}
    types = {
        spec.id_column: pl.Int64,
        **{c: pl.Float64 for c in spec.numeric},
        **{c: pl.String for c in spec.categorical},
        **{c: pl.List(pl.Int64) for c in spec.histories},
    }
    return model.user_vectors(pl.DataFrame(columns, schema=types))  # the training code's own encoding


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_infers_the_registry_version(tower_server, tower_registry, tmp_path, binary):
    registry, _ = tower_registry
    client = triton.InferenceServerClient(tower_server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert "model_repository" in client.get_server_metadata()["extensions"]
    assert client.is_model_ready("personalization") and client.is_model_ready("personalization", "1")
    metadata = client.get_model_metadata("personalization")
    assert metadata["versions"] == ["1"] and metadata["parameters"]["follows"] == "alias 'champion'"
    arrays = tower_inputs(metadata, np.random.default_rng(7))
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(
            name,
            list(array.shape),
            "BYTES"
            if array.dtype == object
            else {np.dtype(np.int64): "INT64", np.dtype(np.float64): "FP64"}[array.dtype],
        )
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = [triton.InferRequestedOutput("user_vector", binary_data=binary)]
    result = client.infer("personalization", inputs, outputs=outputs, request_id="r-1")
    assert result.get_response()["model_version"] == "1" and result.get_response()["id"] == "r-1"
    np.testing.assert_allclose(
        result.as_numpy("user_vector"), expected_vectors(registry, "1", arrays, tmp_path), rtol=1e-5, atol=1e-6
    )
    challenger = client.infer("personalization-challenger", inputs, outputs=outputs)
    assert challenger.get_response()["model_version"] == "2"
    assert not np.allclose(challenger.as_numpy("user_vector"), result.as_numpy("user_vector"))
    pinned = client.infer("personalization", inputs, model_version="1", outputs=outputs)
    np.testing.assert_array_equal(pinned.as_numpy("user_vector"), result.as_numpy("user_vector"))


def json_tensor(name, datatype, shape, data):
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def valid_body(client) -> dict:
    metadata = client.get_model_metadata("personalization")
    arrays = tower_inputs(metadata, np.random.default_rng(1))
    inputs = [
        json_tensor(
            n,
            "BYTES" if a.dtype == object else ("INT64" if a.dtype == np.int64 else "FP64"),
            list(a.shape),
            [v.decode() for v in a.tolist()] if a.dtype == object else a.tolist(),
        )
        for n, a in arrays.items()
    ]
    return {"inputs": inputs}


def with_input(body: dict, name: str, **changes) -> dict:
    return {"inputs": [{**t, **changes} if t["name"] == name else t for t in body["inputs"]]}


def test_client_mistakes_are_4xx_naming_the_problem(tower_server):
    client = triton.InferenceServerClient(tower_server.url.removeprefix("http://"))
    body = valid_body(client)
    url = f"{tower_server.url}/v2/models/personalization/infer"
    assert httpx.post(url, json=body).status_code == 200
    numeric = next(t["name"] for t in body["inputs"] if t["datatype"] == "FP64")
    cases = [
        (url.replace("personalization", "nope"), body, 404, "unknown model 'nope'"),
        (url.replace("/infer", "/versions/9/infer"), body, 404, "no version '9'"),
        (url, with_input(body, "user_id", datatype="FP99"), 400, "unknown datatype 'FP99'"),
        (url, with_input(body, "user_id", datatype="FP32", data=[1.5, 2.5, 3.5]), 400, "datatype FP32, expected INT64"),
        (url, with_input(body, "user_id", shape=[4]), 400, "needs 4 values, data has 3"),
        (url, with_input(body, "user_id", shape=[-3]), 400, "negative dimension"),
        (url, with_input(body, "user_id", shape=[3, 1], data=[[1], [2], [3]]), 400, "shape [3, 1] does not match"),
        (url, with_input(body, "user_id", data=[1, "two", 3]), 400, "must be integers"),
        (url, with_input(body, "user_id", data=[1, 2, 2**70]), 400, "out of range for INT64"),
        (url, with_input(body, numeric, data=[1.0, True, 2.0]), 400, "must be numbers"),
        (url, {"inputs": [*body["inputs"], json_tensor("extra", "FP32", [1], [1.0])]}, 400, "no input(s) ['extra']"),
        (url, {"inputs": body["inputs"][1:]}, 400, "needs input(s) ['user_id']"),
        (url, with_input(body, "user_id", shape=[2], data=[1, 2]), 400, "batch size"),
        (url, {"inputs": [{"name": "user_id"}]}, 400, "invalid inference request"),
        (url, {**body, "outputs": [{"name": "nope"}]}, 400, "no output(s) ['nope']"),
    ]
    for target, payload, status, message in cases:
        response = httpx.post(target, json=payload)
        assert response.status_code == status and message in response.json()["error"], (message, response.text)
    bad_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "invalid inference request" in bad_json.json()["error"]
    assert httpx.get(f"{tower_server.url}/v2/models/nope").status_code == 404
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("nope")


def test_binary_tensor_mistakes_are_400(tower_server):
    url = f"{tower_server.url}/v2/models/personalization/infer"
    header = b'{"inputs":[{"name":"user_id","datatype":"INT64","shape":[2],"parameters":{"binary_data_size":16}}]}'
    cases = [
        (header + b"\x00" * 8, str(len(header)), "does not fit"),
        (header + b"\x00" * 24, str(len(header)), "binary bytes after"),
        (header, "abc", "must be an integer"),
        (header, str(len(header) + 5), "outside the body"),
    ]
    for body, length, message in cases:
        response = httpx.post(url, content=body, headers={"Inference-Header-Content-Length": length})
        assert response.status_code == 400 and message in response.json()["error"], response.text


def test_repository_index_load_and_unload(tower_server):
    url = tower_server.url
    index = httpx.post(f"{url}/v2/repository/index", json={}).json()
    assert {(m["name"], m["version"], m["state"]) for m in index} == {
        ("personalization", "1", "READY"),
        ("personalization-challenger", "2", "READY"),
    }
    assert httpx.post(f"{url}/v2/repository/models/personalization-challenger/unload", headers=ADMIN).status_code == 200
    assert httpx.get(f"{url}/v2/models/personalization-challenger/ready").status_code == 503
    unloaded = httpx.post(f"{url}/v2/repository/index", json={"ready": True}).json()
    assert [m["name"] for m in unloaded] == ["personalization"]
    pinned = httpx.post(
        f"{url}/v2/repository/models/personalization-challenger/load",
        json={"parameters": {"version": "1"}},
        headers=ADMIN,
    )
    assert pinned.status_code == 200 and pinned.json()["version"] == "1"
    missing = httpx.post(
        f"{url}/v2/repository/models/personalization-challenger/load",
        json={"parameters": {"version": "99"}},
        headers=ADMIN,
    )
    assert missing.status_code == 400 and "v99 failed to load" in missing.json()["error"]
    assert httpx.get(f"{url}/v2/models/personalization-challenger").json()["versions"] == ["1"]  # still serving
    back = httpx.post(
        f"{url}/v2/repository/models/personalization-challenger/load",
        json={"parameters": {"alias": "challenger"}},
        headers=ADMIN,
    )
    assert back.status_code == 200 and back.json()["version"] == "2"
    assert httpx.post(f"{url}/v2/repository/models/nope/load", headers=ADMIN).status_code == 404
    assert (
        httpx.post(
            f"{url}/v2/repository/models/personalization/load", json={"parameters": {"flavour": "x"}}, headers=ADMIN
        ).status_code
        == 400
    )


def test_openapi_document_describes_the_bodies(tower_server):
    spec = httpx.get(f"{tower_server.url}/openapi.json").json()
    infer = spec["paths"]["/v2/models/{name}/infer"]["post"]
    assert infer["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/InferenceRequest")
    schemas = spec["components"]["schemas"]
    assert {
        "InferenceRequest",
        "RequestInput",
        "InferenceResponse",
        "ModelMetadataResponse",
        "ErrorResponse",
        "RecommendRequest",
        "GetOnlineFeaturesRequest",
    } <= set(schemas)
    assert {
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/v2/models/{name}/ready",
        "/v2/repository/index",
        "/v2/repository/models/{name}/load",
        "/recommend",
        "/get-online-features",
    } <= set(spec["paths"])
