"""The kinds of registry model the platform serves, in one table: the model server's settings accept these
names, the server loads each with its loader (`ModelServer.LOADERS`, serving/models/server.py), and the
Triton export makes the parts named here (engines/models/model_export.py). A new kind is a row here and a
loader there; `tests/serving/models/test_kinds.py` checks that the two agree."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelKind:
    name: str
    triton_parts: tuple[str, ...] = ()  # the Triton models an export makes of a version; none: not exported


KINDS = {
    kind.name: kind
    for kind in (
        ModelKind("two_tower", ("user_tower", "item_tower")),
        ModelKind("clip_text", ("text",)),
        ModelKind("clip_image", ("image",)),
        ModelKind("content_violation"),
        ModelKind("item_search"),
        ModelKind("vision_llm"),
    )
}
EXPORTED_KINDS = {kind.name: kind.triton_parts for kind in KINDS.values() if kind.triton_parts}
