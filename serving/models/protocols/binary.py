"""The binary tensor data extension (Triton's, used by tritonclient by default): the JSON header is
followed by raw tensors; `Inference-Header-Content-Length` says where the header ends, each tensor's
`parameters.binary_data_size` how many bytes it takes. Fixed-size types are little-endian row-major;
BYTES elements are each a 4-byte little-endian length then the bytes."""

from __future__ import annotations

import json
import struct

import numpy as np

from serving.models.protocols.protocol import (
    DATATYPES,
    InferenceRequest,
    ProtocolError,
    RequestInput,
    check_finite,
    datatype_of,
    decode_input,
    element_count,
)

HEADER = "inference-header-content-length"


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        size = int(header_length)
    except ValueError as error:
        raise ProtocolError(400, f"{HEADER} must be an integer, got {header_length!r}") from error
    if not 0 <= size <= len(body):
        raise ProtocolError(400, f"{HEADER} {size} is outside the body's {len(body)} bytes")
    return body[:size], body[size:]


def decode_inputs(request: InferenceRequest, binary: bytes) -> dict[str, np.ndarray]:
    """Each input from its JSON data or its slice of the binary part, in order."""
    out: dict[str, np.ndarray] = {}
    offset = 0
    for tensor in request.inputs:
        if tensor.name in out:
            raise ProtocolError(400, f"input {tensor.name!r} is given twice")
        size = (tensor.parameters or {}).get("binary_data_size")
        if size is None:
            out[tensor.name] = decode_input(tensor)
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
            raise ProtocolError(
                400,
                f"input {tensor.name!r}: binary_data_size {size!r} does not fit the "
                f"{len(binary) - offset} binary bytes left",
            )
        out[tensor.name] = decode_binary(tensor, binary[offset : offset + size])
        offset += size
    if offset != len(binary):
        raise ProtocolError(400, f"{len(binary) - offset} binary bytes after the last binary input")
    return out


def decode_binary(tensor: RequestInput, raw: bytes) -> np.ndarray:
    count = element_count(tensor)
    if tensor.datatype == "BYTES":
        values, position = [], 0
        while position < len(raw):
            if position + 4 > len(raw):
                raise ProtocolError(400, f"input {tensor.name!r}: truncated BYTES element length")
            (length,) = struct.unpack_from("<I", raw, position)
            position += 4
            if position + length > len(raw):
                raise ProtocolError(400, f"input {tensor.name!r}: BYTES element longer than the data")
            values.append(raw[position : position + length])
            position += length
        if len(values) != count:
            raise ProtocolError(
                400, f"input {tensor.name!r}: shape {tensor.shape} needs {count} values, binary data has {len(values)}"
            )
        return np.array(values or [], dtype=object).reshape(tensor.shape)
    dtype = DATATYPES[tensor.datatype].newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise ProtocolError(
            400,
            f"input {tensor.name!r}: shape {tensor.shape} of {tensor.datatype} needs "
            f"{count * dtype.itemsize} bytes, got {len(raw)}",
        )
    array = check_finite(np.frombuffer(raw, dtype=dtype), tensor.name).reshape(tensor.shape)
    if tensor.datatype == "BOOL" and array.size and array.view(np.uint8).max() > 1:
        raise ProtocolError(400, f"input {tensor.name!r}: BOOL bytes must be 0 or 1")
    return array.astype(DATATYPES[tensor.datatype], copy=False)


def to_bytes(array: np.ndarray) -> bytes:
    if array.dtype == object:
        parts = []
        for value in array.reshape(-1).tolist():
            data = value if isinstance(value, bytes) else str(value).encode()
            parts += [struct.pack("<I", len(data)), data]
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def encode_binary_response(header: dict, arrays: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """The response header with binary outputs (those named in `arrays`) appended; (body, header length)."""
    blobs = []
    for output in header["outputs"]:
        array = arrays.get(output["name"])
        if array is None:
            continue
        blob = to_bytes(array)
        output.pop("data", None)
        output["datatype"] = datatype_of(array)
        output["parameters"] = {**(output.get("parameters") or {}), "binary_data_size": len(blob)}
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b"".join(blobs), len(text)
