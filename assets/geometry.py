"""Geometry features of the catalogue's 3D meshes: the daily Ray Data job (engines.retrieval.geometry_job) whose
table is the batch source of the `item_geometry` feature view."""

import time

import polars as pl
from dagster import AssetCheckSpec, BackfillPolicy, Config, MaterializeResult, asset
from pydantic import Field

from assets.ingestion import warehouse_key
from assets.metadata import frame_metadata, quality_gate, table
from assets.partitions import daily_partitions, partition_days
from engines.data.expectations import Suite, gxe
from engines.retrieval.geometry_job import OUTPUT_SCHEMA, GeometryConfig, measure_items, write_item_geometry
from feature_defs.sources import item_geometry, items
from resources.lake import LakeResource
from resources.quality import QualityResource
from resources.ray import RayResource

ITEM_GEOMETRY = warehouse_key(item_geometry)
SUITE = Suite(
    "geometry_items",
    [
        gxe.ExpectTableColumnsToMatchSet(column_set=item_geometry.columns, exact_match=True),
        gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
        gxe.ExpectColumnValuesToBeUnique(column="item_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="updated_at"),
        gxe.ExpectColumnValuesToBeBetween(column="vertex_count", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="surface_area", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="convex_hull_ratio", min_value=0, max_value=1 + 1e-6),
        *[
            gxe.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=1)
            for c in ("symmetry_score", "silhouette_fill_top", "silhouette_fill_front", "silhouette_fill_side")
        ],
    ],
)


class ItemGeometryConfig(Config):
    block_rows: int = Field(default=32, description="Items per Ray task")
    resolution: int = Field(default=64, description="Silhouette pixels per side")


@asset(
    key=ITEM_GEOMETRY,
    group_name="geometry",
    description="Geometry of the items new or changed each day, measured from their mesh files (landing/meshes, "
    "glTF or OBJ) by a Ray Data job with trimesh: counts, area, volume (watertight meshes), bounding "
    "box, convex-hull ratio, symmetry, silhouette fill. A broken mesh gets a row with mesh_error; "
    "one row per item. Written to warehouse/item_geometry, the source of feature view item_geometry.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[warehouse_key(items)],
    kinds={"ray", "parquet"},
    owners=["team:ml-platform"],
    tags={"domain": "dimensions"},
    check_specs=[
        AssetCheckSpec(
            "great_expectations",
            asset=ITEM_GEOMETRY,
            blocking=True,
            description=f"great-expectations suite {SUITE.name}",
        )
    ],
)
def item_geometry_asset(
    context, config: ItemGeometryConfig, lake: LakeResource, ray: RayResource, quality: QualityResource
):
    store = lake.get_client()
    ray.ensure_started()
    job = GeometryConfig(block_rows=config.block_rows, resolution=config.resolution)
    days, frames, started = partition_days(context), [], time.perf_counter()
    for day in days:
        path = store.partition_path("warehouse", items.name, day)
        catalogue = pl.read_parquet(path) if path.exists() else pl.DataFrame()
        # a day without changes still gets its (empty) partition: the view reads every day
        frames.append(
            measure_items(catalogue, store.root / "landing", job)
            if catalogue.height
            else pl.DataFrame(schema=OUTPUT_SCHEMA)
        )
        context.log.info(
            f"geometry {day}: {catalogue.height} items, {frames[-1]['mesh_error'].is_not_null().sum()} broken meshes"
        )
    seconds = time.perf_counter() - started
    yield from quality_gate(quality, SUITE, dict(zip(days, frames)), "item geometry")
    for day, frame in zip(days, frames):
        write_item_geometry(store, day, frame)
    everything = pl.concat(frames)
    broken = everything.filter(pl.col("mesh_error").is_not_null())
    yield MaterializeResult(
        metadata={
            **frame_metadata(everything),
            "broken_meshes": broken.height,
            "items_per_second": round(everything.height / seconds, 1) if seconds else 0.0,
            "days": table(
                [
                    {"day": d.isoformat(), "items": f.height, "broken": int(f["mesh_error"].is_not_null().sum())}
                    for d, f in zip(days, frames)
                ]
            ),
            "broken_items": table(
                [{"item_id": r["item_id"], "reason": r["mesh_error"]} for r in broken.head(200).iter_rows(named=True)]
            ),
        }
    )


geometry_assets = [item_geometry_asset]
