"""Properties of the gRPC front end (serving/models/protocols/grpc_server.py) over arbitrary requests, drawn by
hypothesis: any model name and version, tensors of any name, datatype and shape (negative, zero, up to
int64's largest) with typed contents of any field or raw contents of any bytes, any parameters and
requested outputs. Whatever comes, the answer is OK or a refusal naming the caller's fault
(INVALID_ARGUMENT, NOT_FOUND, or RESOURCE_EXHAUSTED for a tensor over the limits; UNAVAILABLE only
for item scores, which need the item catalogue this test server has not): never UNKNOWN, INTERNAL or
a hang. An OK answer is well formed: one raw content per output, of the length its
datatype and shape say. Half the requests are built from the model's own metadata, so they get past
the checks and reach the model with arbitrary values."""

from __future__ import annotations

import math

import grpc
import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from serving.models.config import ServerConfig
from tests.serving.models.conftest import TOWER_ENTRIES, free_port, start_server

REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
DATATYPES += ["BYTES", "BF16", "int64", "", "STRING"]
ITEM_SIZE = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "UINT32": 4, "INT32": 4, "FP32": 4}
ITEM_SIZE |= {"UINT64": 8, "INT64": 8, "FP64": 8}
INT32, INT64 = 2**31, 2**63
CONTENTS = {  # each typed-contents field with the values protobuf lets it carry
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-INT32, INT32 - 1),
    "int64_contents": st.integers(-INT64, INT64 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=12),
}
FIELD_OF = {"BOOL": "bool_contents", "INT64": "int64_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
FIELD_OF |= {t: "int_contents" for t in ("INT8", "INT16", "INT32")} | {"FP32": "fp32_contents"}
FIELD_OF |= {"UINT64": "uint64_contents"} | {t: "uint_contents" for t in ("UINT8", "UINT16", "UINT32")}
PROPERTIES = settings(
    max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.fixture(scope="module")
def served(tower_registry, tmp_path_factory):
    """The server with its gRPC front end, a stub to it and the model's input metadata (from REST)."""
    _, root = tower_registry
    config = ServerConfig(
        registry_root=str(root / "registry"),
        lake_root=str(tmp_path_factory.mktemp("grpc_properties_lake")),
        models=TOWER_ENTRIES,
        poll_interval_s=0.5,
        feature_log_sample=0.0,
    )
    port = free_port()
    running = start_server(config, grpc_port=port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 2**26)])
    metadata = httpx.get(f"{running.url}/v2/models/personalization", timeout=30).json()
    yield pb_grpc.GRPCInferenceServiceStub(channel), metadata["inputs"]
    channel.close()
    running.stop()


def parameter():
    return st.one_of(
        st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
        st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-INT64, INT64 - 1)),
        st.builds(lambda v: pb.InferParameter(string_param=v), st.text(max_size=8)),
        st.builds(lambda v: pb.InferParameter(double_param=v), st.floats()),
        st.builds(lambda v: pb.InferParameter(uint64_param=v), st.integers(0, 2**64 - 1)),
    )


@st.composite
def any_tensor(draw, names: list[str]):
    """A tensor anything may be wrong with, and its raw contents (None: typed contents instead)."""
    tensor = pb.ModelInferRequest.InferInputTensor(
        name=draw(st.sampled_from([*names, "x", ""])),
        datatype=draw(st.sampled_from(DATATYPES)),
        shape=draw(st.lists(st.one_of(st.integers(-2, 5), st.integers(-INT64, INT64 - 1)), max_size=3)),
    )
    if draw(st.booleans()):
        return tensor, draw(st.binary(max_size=64))
    field = draw(st.sampled_from(sorted(CONTENTS)))
    getattr(tensor.contents, field).extend(draw(st.lists(CONTENTS[field], max_size=8)))
    return tensor, None


@st.composite
def fitting_tensor(draw, spec: dict, rows: int):
    """A tensor as the metadata describes it (its -1 dimensions `rows` or a few), arbitrary values."""
    shape = [
        rows if i == 0 and d == -1 else (draw(st.integers(0, 4)) if d == -1 else d) for i, d in enumerate(spec["shape"])
    ]
    tensor = pb.ModelInferRequest.InferInputTensor(name=spec["name"], datatype=spec["datatype"], shape=shape)
    count = math.prod(shape)
    field = FIELD_OF.get(spec["datatype"])
    if field is None:  # no typed contents (FP16, BF16): raw bytes of the right length
        return tensor, draw(st.binary(min_size=2 * count, max_size=2 * count))
    getattr(tensor.contents, field).extend(draw(st.lists(CONTENTS[field], min_size=count, max_size=count)))
    return tensor, None


@st.composite
def requests(draw, inputs: list[dict]):
    request = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["personalization", "personalization-challenger", "nope", ""])),
        model_version=draw(st.sampled_from(["", "", "1", "2", "99", "x"])),
        id=draw(st.text(max_size=6)),
    )
    if draw(st.booleans()):  # built from the metadata: reaches the model
        rows = draw(st.integers(1, 3))
        user_tower = [spec for spec in inputs if spec["name"] != "item_ids"]  # item scores need a catalogue
        tensors = [draw(fitting_tensor(spec, rows)) for spec in user_tower if draw(st.integers(0, 9)) > 0]
    else:
        tensors = draw(st.lists(any_tensor([spec["name"] for spec in inputs]), max_size=4))
    for tensor, _ in tensors:
        request.inputs.append(tensor)
    raw = [content for _, content in tensors if content is not None]
    if raw and (len(raw) == len(tensors) or draw(st.booleans())):
        request.raw_input_contents.extend(raw)
    for key, value in draw(st.dictionaries(st.text(max_size=8), parameter(), max_size=3)).items():
        request.parameters[key].CopyFrom(value)
    for name in draw(st.lists(st.sampled_from(["user_vector", "nope", ""]), max_size=2)):
        request.outputs.append(pb.ModelInferRequest.InferRequestedOutputTensor(name=name))
    return request


def assert_well_formed(response) -> None:
    assert len(response.raw_output_contents) == len(response.outputs)
    for output, content in zip(response.outputs, response.raw_output_contents, strict=True):
        assert all(d >= 0 for d in output.shape)
        if output.datatype in ITEM_SIZE:
            assert len(content) == ITEM_SIZE[output.datatype] * math.prod(output.shape), output


@pytest.mark.services  # a server with its gRPC front end, driven by hypothesis
def test_any_infer_request_is_answered_or_refused_as_the_callers_fault(served):
    stub, inputs = served
    outcomes: dict[str, int] = {}

    @given(request=requests(inputs))
    @PROPERTIES
    def check(request):
        try:
            response = stub.ModelInfer(request, timeout=60)
        except grpc.RpcError as error:
            missing = error.code() == grpc.StatusCode.UNAVAILABLE and "item catalogue" in error.details()
            assert error.code() in REFUSALS or missing, (error.code(), error.details(), request)
            assert error.details(), request  # a refusal says why
            outcomes[error.code().name] = outcomes.get(error.code().name, 0) + 1
            return
        assert_well_formed(response)
        outcomes["OK"] = outcomes.get("OK", 0) + 1

    check()
    # the draws reach every kind of answer, the model's included
    assert outcomes.get("OK", 0) > 10 and outcomes.get("INVALID_ARGUMENT", 0) > 10 and outcomes.get("NOT_FOUND"), (
        outcomes
    )


def test_fitting_requests_match_the_metadata():
    """The strategy's own check: a fitting tensor has as many values as its shape holds."""
    spec = {"name": "user_engagement__last_clicked_items", "datatype": "INT64", "shape": [-1, -1]}

    @given(tensor=fitting_tensor(spec, 2))
    @settings(max_examples=20, derandomize=True, database=None)
    def check(tensor):
        tensor, raw = tensor
        assert raw is None and len(tensor.contents.int64_contents) == np.prod(tensor.shape)

    check()
