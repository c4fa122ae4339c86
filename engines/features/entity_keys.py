"""Feast's entity keys, serialized as its online stores key their rows."""

from __future__ import annotations

import struct
from functools import lru_cache

from feast import ValueType


@lru_cache(maxsize=256)
def key_serializer(keys: tuple[tuple[str, ValueType], ...]):
    """Feast's serialize_entity_key (version 3) for entity keys of these join keys, without protos:
    the key names sorted, each as STRING, then the values in that order (int64 or string)."""
    order = sorted(range(len(keys)), key=lambda i: keys[i][0])
    names = [keys[i][0].encode("utf8") for i in order]
    head = struct.pack("<I", len(keys)) + b"".join(
        struct.pack("<II", ValueType.STRING.value, len(n)) + n for n in names
    )
    types = [keys[i][1] for i in order]
    if any(t not in (ValueType.INT64, ValueType.STRING) for t in types):
        raise TypeError(f"unsupported entity key types {types}")
    int64_head, string_type = struct.pack("<II", ValueType.INT64.value, 8), ValueType.STRING.value
    ints = [t == ValueType.INT64 for t in types]  # plain booleans: no Enum lookups per key

    def serialize(values: tuple) -> bytes:
        out = [head]
        for i, is_int in zip(order, ints):
            if is_int:
                out += [int64_head, struct.pack("<q", int(values[i]))]
            else:
                encoded = values[i].encode("utf8")
                out += [struct.pack("<II", string_type, len(encoded)), encoded]
        return b"".join(out)

    return serialize
