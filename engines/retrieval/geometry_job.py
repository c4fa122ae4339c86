"""The geometry job: measures (engines.retrieval.geometry) of the day's new and changed items' meshes, as a Ray
Data pipeline over blocks of catalogue rows (each task reads its meshes from landing and measures them),
or as a plain loop (`measure_items_locally`, the benchmark's peer). Plain Python, no Dagster.

A broken mesh gives a row with `mesh_error`; a failed task is retried and a killed worker's task re-run;
the result is checked to hold exactly one row per input item.

Table `warehouse/item_geometry/date=D/part-0.parquet` (the DSL source `item_geometry`): item_id,
updated_at (the catalogue row's), the measures and mesh_error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import polars as pl
import pyarrow as pa

from engines.data.lake import Lake
from engines.models.ray_objects import blocks_dataset
from engines.retrieval.geometry import MEASURE_TYPES, RESOLUTION, MeshMeasures, measure_file

GEOMETRY_TABLE = "item_geometry"  # in the warehouse zone, next to the ingested sources
_ARROW = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string()}
_POLARS = {"int64": pl.Int64, "float64": pl.Float64, "bool": pl.Boolean, "string": pl.String}
OUTPUT_SCHEMA = pl.Schema(
    {
        "item_id": pl.Int64,
        "updated_at": pl.Datetime("us", "UTC"),
        **{k: _POLARS[t] for k, t in MEASURE_TYPES.items()},
    }
)


@dataclass(frozen=True)
class FailureDrill:
    """For failure drills and tests: the first task holding `item_id` fails once (raises, or with
    `kill` its worker process dies); `marker` records that it happened."""

    item_id: int
    marker: str
    kill: bool = False


@dataclass(frozen=True)
class GeometryConfig:
    block_rows: int = 32  # items per task
    resolution: int = RESOLUTION
    task_retries: int = 3
    drill: FailureDrill | None = field(default=None)


def measure_items(items: pl.DataFrame, landing: Path, config: GeometryConfig = GeometryConfig()) -> pl.DataFrame:
    """One row per item (OUTPUT_SCHEMA) for `items` (item_id, updated_at, mesh_path relative to
    `landing`), measured by Ray Data tasks. Ray must be started."""
    import ray

    _check_input(items)
    if items.is_empty():
        return pl.DataFrame(schema=OUTPUT_SCHEMA)
    source = items.select("item_id", "updated_at", "mesh_path").to_arrow()
    dataset = blocks_dataset(source, config.block_rows).map_batches(
        measure_batch,
        fn_kwargs={"landing": str(landing), "resolution": config.resolution, "drill": config.drill},
        batch_size=config.block_rows,
        batch_format="pyarrow",
        max_retries=config.task_retries,
        retry_exceptions=True,
    )
    tables = [t for t in ray.get(dataset.to_arrow_refs()) if t.num_rows]
    written = pl.from_arrow(pa.concat_tables(tables)) if tables else pl.DataFrame(schema=OUTPUT_SCHEMA)
    return _one_row_per_item(items, written.cast(OUTPUT_SCHEMA).unique("item_id", keep="first"))


def measure_items_locally(items: pl.DataFrame, landing: Path, resolution: int = RESOLUTION) -> pl.DataFrame:
    """The same rows in one process, item after item."""
    _check_input(items)
    table = measure_batch(items.select("item_id", "updated_at", "mesh_path").to_arrow(), str(landing), resolution)
    return _one_row_per_item(items, pl.from_arrow(table).cast(OUTPUT_SCHEMA))


def measure_batch(batch: pa.Table, landing: str, resolution: int, drill: FailureDrill | None = None) -> pa.Table:
    """Read and measure the meshes of a block of catalogue rows."""
    item_ids = batch.column("item_id").to_pylist()
    if drill and drill.item_id in item_ids and not os.path.exists(drill.marker):
        Path(drill.marker).write_text("failed once\n")
        if drill.kill:
            os._exit(1)  # the worker dies mid-task, as on an OOM kill or a lost node
        raise RuntimeError(f"failure drill: task with item {drill.item_id}")
    rows = [_measure_path(landing, relative, resolution).row() for relative in batch.column("mesh_path").to_pylist()]
    columns = {"item_id": batch.column("item_id"), "updated_at": batch.column("updated_at")}
    for name, dtype in MEASURE_TYPES.items():
        columns[name] = pa.array([r[name] for r in rows], _ARROW[dtype])
    return pa.table(columns)


def _measure_path(landing: str, relative: str | None, resolution: int) -> MeshMeasures:
    if not relative:
        return MeshMeasures(mesh_error="no mesh path")
    path = Path(landing) / relative
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return MeshMeasures(mesh_error=f"mesh file missing: {relative}")
    except OSError as error:
        return MeshMeasures(mesh_error=f"unreadable: {error.strerror or error}")
    return measure_file(data, path.suffix.lstrip(".").lower(), resolution)


def _check_input(items: pl.DataFrame) -> None:
    missing = {"item_id", "updated_at", "mesh_path"} - set(items.columns)
    if items.width and missing:
        raise ValueError(f"geometry job: input lacks columns {sorted(missing)}")
    if items.height and items["item_id"].n_unique() != items.height:
        raise ValueError("geometry job: duplicate item_id in the input")


def _one_row_per_item(items: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    expected, got = set(items["item_id"].to_list()), set(rows["item_id"].to_list())
    if got != expected:
        raise RuntimeError(f"geometry job lost {len(expected - got)} and invented {len(got - expected)} items")
    return rows.sort("item_id")


def write_item_geometry(lake: Lake, day: date, frame: pl.DataFrame) -> Path:
    return lake.write_partition("warehouse", GEOMETRY_TABLE, day, frame)


def current_geometry(lake: Lake) -> pl.DataFrame:
    """The item_geometry feature view's newest row per item (offline table, all days): what serving holds."""
    days = lake.partition_days("offline", GEOMETRY_TABLE)
    if not days:
        return pl.DataFrame(schema={"item_id": pl.Int64, "face_count": pl.Int64, "is_watertight": pl.Boolean})
    rows = lake.scan_partitions("offline", GEOMETRY_TABLE, days).sort("event_timestamp")
    return rows.unique("item_id", keep="last").sort("item_id").collect()
