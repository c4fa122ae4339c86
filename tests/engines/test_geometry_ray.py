"""The geometry job on a real Ray (in-process, 2 CPUs): the same rows as the plain loop, and exactly one
row per item when a task raises or its worker process is killed; and the datasets of our Ray pipelines
keep Ray Data's operator reservations off."""

import tempfile
from datetime import date

import polars as pl
import pyarrow as pa
import pytest
import ray
from polars.testing import assert_frame_equal

from engines.models.ray_objects import blocks_dataset
from engines.retrieval.geometry_job import FailureDrill, GeometryConfig, measure_items, measure_items_locally
from resources.ray import RayResource
from simulator import Simulator, SimulatorConfig


@pytest.fixture(scope="module")
def geometry_ray(tmp_path_factory):
    """A small simulated catalogue with its meshes (some broken), and Ray started."""
    root = tmp_path_factory.mktemp("geometry")
    sim = Simulator(SimulatorConfig(seed=4, start_date=date(2026, 1, 1)).scaled(0.15), root)
    _, changed = sim.world.at(0)
    for item in changed.items.itertuples():
        sim.write_mesh(item)
    items = pl.from_pandas(changed.items[["item_id", "updated_at", "mesh_path"]]).with_columns(
        pl.col("updated_at").cast(pl.Datetime("us", "UTC"))
    )
    RayResource(num_cpus=2, object_store_mb=200, temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp")).ensure_started()
    yield {"landing": root / "landing", "items": items, "plain": measure_items_locally(items, root / "landing")}
    ray.shutdown()


def test_ray_gives_the_plain_loops_rows(geometry_ray):
    rows = measure_items(geometry_ray["items"], geometry_ray["landing"], GeometryConfig(block_rows=16))
    assert rows["mesh_error"].null_count() < rows.height  # some broken, most measured
    assert_frame_equal(rows, geometry_ray["plain"])


@pytest.mark.parametrize("kill", [False, True], ids=["task_raises", "worker_killed"])
def test_a_failed_task_still_gives_one_row_per_item(geometry_ray, tmp_path, kill):
    items = geometry_ray["items"]
    victim = int(items["item_id"][items.height // 2])
    marker = tmp_path / "failed"
    rows = measure_items(
        items,
        geometry_ray["landing"],
        GeometryConfig(block_rows=16, drill=FailureDrill(victim, str(marker), kill=kill)),
    )
    assert marker.exists(), "the failure was not injected"
    assert rows["item_id"].to_list() == sorted(items["item_id"].to_list())
    assert_frame_equal(rows, geometry_ray["plain"])


def test_pipeline_datasets_turn_off_operator_reservations_on_their_own_context(geometry_ray):
    """With Ray Data's default reservations the embedding pipeline ran one task at a time on 2 CPUs
    (0.73x a plain loop, 1.05x without; benchmarks/embeddings.py): off for our datasets only."""
    dataset = blocks_dataset(pa.table({"block": [0, 1]}), 1)
    assert dataset.context.op_resource_reservation_enabled is False
    assert ray.data.DataContext.get_current().op_resource_reservation_enabled is True
    assert dataset.map_batches(lambda t: t, batch_format="pyarrow").context.op_resource_reservation_enabled is False
