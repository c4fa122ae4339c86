"""Large objects (models, vector-index replicas) shipped to Ray workers through the object store and
built once per worker process.

Ray Data tasks run in worker processes that Ray keeps for the whole job, so a model unpickled by the
first task is still there for the next one: no actor start-up (a fresh process importing torch) per
pipeline, and nothing read from a node-local path. `Shipped` wraps the object reference so that
Ray does not resolve it into every task's arguments; `cached` fetches it on a process's first use.
The cache holds one object per kind (a new reference replaces the old one) and never the reference
itself, so the object store can free it when the driver is done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")

_CACHE: dict[str, tuple[str, Any, Callable[[Any], None] | None]] = {}


@dataclass(frozen=True)
class Shipped:
    """An object in Ray's object store, passed by reference (the driver keeps it alive while a
    pipeline runs)."""

    ref: Any  # ray.ObjectRef

    @classmethod
    def put(cls, value: Any) -> Shipped:
        import ray

        return cls(ray.put(value))


def cached(kind: str, shipped: Shipped, build: Callable[[Any], T], release: Callable[[T], None] | None = None) -> T:
    """This process's `build(object)` of `shipped`, made on first use; `release` disposes of the
    previous object of the same kind when a new one replaces it."""
    import ray

    key = shipped.ref.hex()
    hit = _CACHE.get(kind)
    if hit is not None and hit[0] == key:
        return hit[1]
    if hit is not None and hit[2] is not None:
        hit[2](hit[1])
    value = build(ray.get(shipped.ref))
    _CACHE[kind] = (key, value, release)
    return value


def cluster_cpus() -> int:
    """Logical CPUs of the Ray cluster (at least 1)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def block_rows(rows: int, at_most: int, at_least: int = 1, per_cpu: int = 2) -> int:
    """Rows per streamed block: about `per_cpu` blocks for each CPU of the cluster (every worker
    gets work, a slow one holds up little), within [at_least, at_most]."""
    wanted = -(-rows // (per_cpu * cluster_cpus()))
    return max(1, at_least, min(at_most, wanted))


def blocks_dataset(table: pa.Table, rows: int):
    """A Ray dataset over an in-memory Arrow table in blocks of `rows` (one empty block for an empty
    table), whose tasks may use every CPU of the cluster.

    With Ray Data's operator reservations (on by default) only one of our map tasks ran at a time on
    a 2-CPU node, the other blocks queued as backpressured by the resource budget (embeddings at
    0.73x a plain loop with them, 1.05x without; benchmarks/embeddings.py).
    Our pipelines are one stage of map tasks, or map tasks feeding an actor pool whose actors hold
    their CPUs for the whole run, so nothing needs reserving. Set on this dataset's own copy of the
    context, never the process-wide one."""
    import ray.data

    blocks = [table.slice(start, rows) for start in range(0, max(table.num_rows, 1), rows)]
    dataset = ray.data.from_arrow(blocks)
    dataset.context.op_resource_reservation_enabled = False
    return dataset
