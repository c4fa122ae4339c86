"""Strict input: ids are JSON integers within int64, numbers are finite, shapes are checked before any
reshape and raw parameters before any conversion; every such mistake is a 400 naming the field, and
every answer is valid JSON."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from serving.models.protocols.protocol import encode_output
from tests.serving.models.test_protocol import valid_body, with_input


@pytest.mark.parametrize("user_id", ["false", "true", "1.0", '"1"', str(2**70), str(-(2**63) - 1)])
def test_recommend_takes_only_int64_user_ids(tower_server, user_id):
    body = '{"user_id": ' + user_id + ', "k": 5}'
    answer = httpx.post(f"{tower_server.url}/recommend", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "user_id" in answer.json()["error"], answer.text


def test_recommend_refuses_out_of_range_excluded_items(tower_server):
    body = {"user_id": 1, "context": {"exclude_item_ids": [2**70]}}
    answer = httpx.post(f"{tower_server.url}/recommend", json=body)
    assert answer.status_code == 400 and "exclude_item_ids" in answer.json()["error"], answer.text


def infer_with_literal(tower_server, literal: str) -> httpx.Response:
    body = valid_body(triton.InferenceServerClient(tower_server.url.removeprefix("http://")))
    numeric = next(t for t in body["inputs"] if t["datatype"] == "FP64")
    text = json.dumps(with_input(body, numeric["name"], data=["__X__"] * len(numeric["data"])))
    return httpx.post(f"{tower_server.url}/v2/models/personalization/infer", content=text.replace('"__X__"', literal))


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "1e400"])
def test_infinite_numbers_are_refused(tower_server, literal):
    answer = infer_with_literal(tower_server, literal)
    assert answer.status_code == 400 and "finite" in answer.json()["error"], answer.text


def test_nan_is_a_missing_value_and_the_answer_stays_json(tower_server):
    answer = infer_with_literal(tower_server, "NaN")  # a missing feature value, as Feast's nulls arrive
    assert answer.status_code == 200, answer.text
    json.loads(answer.text, parse_constant=lambda c: pytest.fail(f"bare {c} in the answer"))


@pytest.mark.parametrize("datatype", ["BYTES", "FP64", "INT64"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_an_empty_tensor_of_huge_dimensions_is_refused_before_reshaping(tower_server, datatype, binary):
    tensor = {"name": "user_id", "datatype": datatype, "shape": [0, 2**62, 2**62]}
    tensor |= {"parameters": {"binary_data_size": 0}} if binary else {"data": []}
    header = json.dumps({"inputs": [tensor]}).encode()
    answer = httpx.post(
        f"{tower_server.url}/v2/models/personalization/infer",
        content=header,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert 400 <= answer.status_code < 500 and "user_id" in answer.json()["error"], answer.text


def test_a_raw_k_parameter_is_checked_not_converted(tower_server):
    body = {
        "inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [1]}],
        "parameters": {"k": "many"},
    }
    answer = httpx.post(f"{tower_server.url}/v2/models/recommend/infer", json=body)
    assert answer.status_code == 400 and "k must be" in answer.json()["error"], answer.text


def test_outputs_are_valid_json_whatever_the_floats():
    encoded = encode_output("scores", np.array([[0.5, np.nan], [np.inf, -np.inf]], np.float32))
    assert json.loads(json.dumps(encoded, allow_nan=False))["data"] == [0.5, None, None, None]
