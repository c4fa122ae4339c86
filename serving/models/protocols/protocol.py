"""The Open Inference Protocol v2 (KServe / Triton): request and response bodies as pydantic models
(they make the OpenAPI document), the datatype table, and tensors decoded from and encoded to JSON
with every check a hostile client needs: datatype known, shape non-negative, data length equal to the
shape's product, values of the datatype's kind and range.

Errors are `ProtocolError(status, message)`; the server answers them as `{"error": message}`.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, Strict


class ProtocolError(Exception):
    """A request the protocol rejects (4xx) or a dependency that is down (503); the message names it."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# v2 datatype -> numpy dtype (BYTES: numpy object arrays of bytes)
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
NUMPY_TO_DATATYPE = {v: k for k, v in DATATYPES.items() if k != "BYTES"}
MAX_ELEMENTS = 10_000_000  # one tensor; a larger one is refused before anything is allocated
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
OFF_LOOP_BYTES = 65_536  # larger request bodies are parsed and decoded in a thread: the event loop keeps serving


# --- bodies ---------------------------------------------------------------------------------
class TensorMetadata(BaseModel):
    name: str
    datatype: str = Field(description="One of " + ", ".join(DATATYPES))
    shape: list[int] = Field(description="-1 marks a variable dimension")


class ServerMetadataResponse(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelMetadataResponse(BaseModel):
    name: str
    versions: list[str] = []
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    parameters: dict[str, Any] = {}


class ReadyResponse(BaseModel):
    ready: bool


class LiveResponse(BaseModel):
    live: bool


class ErrorResponse(BaseModel):
    error: str


class RequestInput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = Field(
        default=None,
        description="Row-major, flattened or nested; BYTES as strings "
        "(base64 with parameters.binary_encoding='base64'); absent when the tensor "
        "travels in the binary extension (parameters.binary_data_size)",
    )


class RequestOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = None


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[ResponseOutput]


class RepositoryIndexRequest(BaseModel):
    ready: Annotated[bool, Strict()] = False  # a JSON boolean: 0 and "yes" are refused


class RepositoryModel(BaseModel):
    name: str
    version: str | None = None
    state: str = Field(description="READY, UNAVAILABLE or LOADING")
    reason: str = ""
    follows: str = Field(default="", description="The alias or version it serves, e.g. \"alias 'champion'\"")
    overridden: bool = Field(
        default=False,
        description="A load changed what it follows; a load without parameters returns to the configuration",
    )


class LoadParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str | None = Field(default=None, min_length=1, description="Serve this registry version")
    alias: str | None = Field(default=None, min_length=1, description="Follow this alias (one of the two)")


class RepositoryLoadRequest(BaseModel):
    parameters: LoadParameters | None = Field(default=None, description="`version` or `alias` to serve")


# --- tensors --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """What a model accepts for one input: datatypes and shape (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def metadata(self) -> TensorMetadata:
        return TensorMetadata(name=self.name, datatype=self.datatype, shape=list(self.shape))


def _flatten(data: list, name: str) -> list:
    if not any(isinstance(v, list) for v in data):
        return data
    flat: list = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


# the Python types JSON values of each kind of datatype may have (bool is not a number; a float is
# not an integer); one C-speed pass over the value types replaces an isinstance check per element
_ALLOWED_TYPES = {"BOOL": ({bool}, "booleans"), "INT": ({int}, "integers"), "FP": ({int, float}, "numbers")}


def _check_values(flat: list, datatype: str, name: str) -> None:
    """Every value of the datatype's kind."""
    allowed, kind = _ALLOWED_TYPES[
        "BOOL" if datatype == "BOOL" else "INT" if datatype.startswith(("INT", "UINT")) else "FP"
    ]
    if set(map(type, flat)) <= allowed:
        return
    bad = next(v for v in flat if type(v) not in allowed)
    raise ProtocolError(400, f"input {name!r}: {datatype} data must be {kind}, got {bad!r}")


def element_count(tensor: RequestInput) -> int:
    """The shape's element count, after checking datatype and shape."""
    name, datatype = tensor.name, tensor.datatype
    if datatype not in DATATYPES:
        raise ProtocolError(400, f"input {name!r}: unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})")
    if any(d < 0 for d in tensor.shape):
        raise ProtocolError(400, f"input {name!r}: shape {tensor.shape} has a negative dimension")
    if any(d > MAX_ELEMENTS for d in tensor.shape):  # an empty tensor of huge dims cannot be reshaped either
        raise ProtocolError(413, f"input {name!r}: shape {tensor.shape} has a dimension over {MAX_ELEMENTS}")
    count = 1
    for d in tensor.shape:
        count *= d
    if count > MAX_ELEMENTS:
        raise ProtocolError(413, f"input {name!r}: {count} elements, more than {MAX_ELEMENTS}")
    return count


def decode_input(tensor: RequestInput) -> np.ndarray:
    """A JSON input tensor as a numpy array of its shape; ProtocolError(400) naming what is wrong."""
    name, datatype = tensor.name, tensor.datatype
    count = element_count(tensor)
    if tensor.data is None:
        raise ProtocolError(400, f"input {name!r} has neither 'data' nor parameters.binary_data_size")
    flat = _flatten(tensor.data, name)
    if len(flat) != count:
        raise ProtocolError(400, f"input {name!r}: shape {tensor.shape} needs {count} values, data has {len(flat)}")
    if datatype == "BYTES":
        binary = (tensor.parameters or {}).get("binary_encoding") == "base64"
        return np.array([_to_bytes(v, name, binary) for v in flat] or [], dtype=object).reshape(tensor.shape)
    _check_values(flat, datatype, name)
    dtype = DATATYPES[datatype]
    try:
        if dtype.kind in "iub":  # numpy refuses a Python integer out of the dtype's range (OverflowError)
            return np.array(flat, dtype=dtype).reshape(tensor.shape)
        array = check_finite(np.array(flat, dtype=np.float64), name)
        if dtype == np.float64:
            return array.reshape(tensor.shape)
        with np.errstate(over="raise", invalid="raise"):  # too large for FP32 / FP16
            return array.astype(dtype).reshape(tensor.shape)
    except (OverflowError, FloatingPointError, ValueError, TypeError) as error:
        raise ProtocolError(400, f"input {name!r}: values out of range for {datatype}") from error


def check_finite(array: np.ndarray, name: str) -> np.ndarray:
    """Infinity and overflowing literals (1e400) are no input. NaN is: it is how a missing feature value
    arrives (the towers read it as missing), as Feast's nulls do."""
    if array.dtype.kind == "f" and np.isinf(array).any():
        raise ProtocolError(400, f"input {name!r}: values must be finite numbers or NaN for missing (no Infinity)")
    return array


def _to_bytes(value: Any, name: str, base64_encoded: bool) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(400, f"input {name!r}: BYTES data must be strings, got {value!r}")
    if base64_encoded:
        try:
            return base64.b64decode(value, validate=True)
        except ValueError as error:
            raise ProtocolError(400, f"input {name!r}: invalid base64") from error
    return value.encode()


def datatype_of(array: np.ndarray) -> str:
    if array.dtype == object:
        return "BYTES"
    datatype = NUMPY_TO_DATATYPE.get(array.dtype)
    if datatype is None:
        raise TypeError(f"numpy dtype {array.dtype} has no v2 datatype")
    return datatype


def encode_output(name: str, array: np.ndarray) -> dict:
    """A numpy array as a JSON output tensor (a ResponseOutput's fields; BYTES as UTF-8 strings, or
    base64 with a parameter when they are not text)."""
    array = np.asarray(array)
    out = {"name": name, "shape": list(array.shape), "datatype": datatype_of(array)}
    if array.dtype == object:
        values = array.reshape(-1).tolist()
        try:
            out["data"] = [v.decode() if isinstance(v, bytes) else str(v) for v in values]
        except UnicodeDecodeError:
            out["data"] = [base64.b64encode(v).decode() for v in values]
            out["parameters"] = {"binary_encoding": "base64"}
        return out
    if array.dtype.kind == "f" and not np.isfinite(array).all():  # JSON has no NaN: null (e.g. padding)
        out["data"] = [v if math.isfinite(v) else None for v in array.reshape(-1).tolist()]
        return out
    out["data"] = array.reshape(-1).tolist()
    return out


def check_inputs(model_name: str, specs: list[TensorSpec], inputs: dict[str, np.ndarray]) -> None:
    """The inputs against the model's specs: known names, required present, datatype, rank and fixed dims."""
    known = {s.name: s for s in specs}
    unknown = sorted(set(inputs) - set(known))
    if unknown:
        raise ProtocolError(400, f"model {model_name!r} has no input(s) {unknown}; inputs: {sorted(known)}")
    missing = [s.name for s in specs if not s.optional and s.name not in inputs]
    if missing:
        raise ProtocolError(400, f"model {model_name!r} needs input(s) {missing}")
    for name, array in inputs.items():
        spec = known[name]
        expected = DATATYPES[spec.datatype]
        if array.dtype != expected:
            actual = "BYTES" if array.dtype == object else NUMPY_TO_DATATYPE.get(array.dtype, str(array.dtype))
            raise ProtocolError(
                400, f"model {model_name!r} input {name!r}: datatype {actual}, expected {spec.datatype}"
            )
        if len(array.shape) != len(spec.shape) or any(
            want != -1 and got != want for got, want in zip(array.shape, spec.shape)
        ):
            raise ProtocolError(
                400,
                f"model {model_name!r} input {name!r}: shape {list(array.shape)} does not "
                f"match {list(spec.shape)} (-1: any size)",
            )
