"""JSON tensors decoded by serving/models/protocols/protocol.py: every datatype's values checked and converted
exactly as numpy holds them, every mistake a 400 naming the input (no server needed)."""

from __future__ import annotations

import numpy as np
import pytest

from serving.models.protocols.protocol import DATATYPES, ProtocolError, RequestInput, decode_input


def tensor(datatype: str, shape: list[int], data) -> RequestInput:
    return RequestInput(name="x", datatype=datatype, shape=shape, data=data)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BYTES"])
def test_each_datatype_round_trips_its_extremes(datatype):
    dtype = DATATYPES[datatype]
    if dtype.kind == "b":
        values = [True, False, True, True]
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = [int(info.min), int(info.max), 0, 7]
    else:
        values = [0.5, -2.0, 3, float(np.finfo(dtype).max) / 2]
    array = decode_input(tensor(datatype, [2, 2], [values[:2], values[2:]]))  # nested rows are flattened
    assert array.dtype == dtype and array.shape == (2, 2)
    np.testing.assert_array_equal(array.reshape(-1), np.array(values, dtype=object).astype(dtype))


@pytest.mark.parametrize(
    "datatype, data, problem",
    [
        ("INT64", [1, True], "must be integers, got True"),
        ("INT64", [1, 2.0], "must be integers, got 2.0"),
        ("INT32", [1, None], "must be integers, got None"),
        ("FP32", [1.0, False], "must be numbers, got False"),
        ("FP64", ["1", 2.0], "must be numbers, got '1'"),
        ("BOOL", [True, 1], "must be booleans, got 1"),
        ("INT8", [1, 128], "out of range for INT8"),
        ("UINT8", [1, -1], "out of range for UINT8"),
        ("UINT64", [2**64, 1], "out of range for UINT64"),
        ("INT64", [2**63, 1], "out of range for INT64"),
        ("FP32", [1e39, 1.0], "out of range for FP32"),
        ("FP16", [70000.0, 1.0], "out of range for FP16"),
        ("FP64", [10**400, 1.0], "out of range for FP64"),
    ],
)
def test_wrong_values_are_400_naming_the_input(datatype, data, problem):
    with pytest.raises(ProtocolError) as raised:
        decode_input(tensor(datatype, [2], data))
    assert raised.value.status == 400 and "'x'" in raised.value.message and problem in raised.value.message
