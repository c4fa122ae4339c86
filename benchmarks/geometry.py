"""Geometry job throughput: items/s of the Ray Data job (engines/retrieval/geometry_job.py: blocks of catalogue rows,
each task reads and measures its meshes) against a plain loop over the same meshes in one process, with
the ratio, median and P99 over repeats. The meshes are the simulator's (a share of them broken).

  .venv/bin/python benchmarks/geometry.py [--items 2000] [--repeat 5] [--ray-cpus 2] [--block-rows 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.retrieval.geometry_job import GeometryConfig, measure_items, measure_items_locally  # noqa: E402
from resources.ray import RayResource  # noqa: E402
from simulator import Simulator, SimulatorConfig  # noqa: E402


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def catalogue(folder: Path, n: int) -> pl.DataFrame:
    """The first n items of a simulated catalogue, with their mesh files under folder/landing."""
    config = SimulatorConfig(seed=5, start_date=date(2026, 1, 1))
    sim = Simulator(config.scaled(max(0.1, n / config.n_items)), folder)
    _, changed = sim.world.at(0)
    rows = changed.items.head(n)
    for item in rows.itertuples():
        sim.write_mesh(item)
    return pl.from_pandas(rows[["item_id", "updated_at", "mesh_path"]]).with_columns(
        pl.col("updated_at").cast(pl.Datetime("us", "UTC"))
    )


def rates(run, items: pl.DataFrame, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        rows = run()
        if rows.height != items.height:
            raise RuntimeError(f"{rows.height} rows for {items.height} items")
        out.append(items.height / (time.perf_counter() - started))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--block-rows", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="geometry-bench-") as folder:
        items = catalogue(Path(folder), args.items)
        landing = Path(folder) / "landing"
        RayResource(num_cpus=args.ray_cpus, temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp")).ensure_started()
        config = GeometryConfig(block_rows=args.block_rows)
        measure_items(items.head(args.block_rows * args.ray_cpus), landing, config)  # warm the workers
        plain = rates(lambda: measure_items_locally(items, landing), items, args.repeat)
        ray_rates = rates(lambda: measure_items(items, landing, config), items, args.repeat)
    print(
        f"geometry of {items.height} meshes, {args.repeat} repeats, Ray with {args.ray_cpus} CPUs, "
        f"{args.block_rows} items per task"
    )
    print(f"{'':24} {'median items/s':>15} {'P99 (slowest) items/s':>22}")
    for name, values in (("plain loop (1 process)", plain), ("Ray Data job", ray_rates)):
        print(f"{name:24} {statistics.median(values):15.1f} {percentile(values, 0.01):22.1f}")
    print(f"ratio Ray / plain loop: {statistics.median(ray_rates) / statistics.median(plain):.2f}x (median)")


if __name__ == "__main__":
    main()
