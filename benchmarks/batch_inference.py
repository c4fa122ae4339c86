"""Batch inference throughput: the Ray Data pipeline against a plain single-process loop, same model,
same users, same vector database, same run.

Both compute every user's vector with the two-tower model and retrieve the user's top-k items from
the vector database (engines/batch_inference.py: engine="ray" and engine="local"). Users are the
active users of the newest simulated day, tiled under new ids to --users rows. The model is built
from the real training set's spec with untrained weights: speed does not depend on the weights.
Each Ray run starts its actor pool (torch import, model load), as a daily batch job does.
Prints median rows/s, median and P99 seconds per run over --repeat runs (after a warm-up run) and the ratio.

  .venv/bin/python benchmarks/batch_inference.py [--data-dir DIR] [--users 5000] [--repeat 5] [--workers 2]

Without --data-dir it simulates 3 days in a temporary folder and runs the daily pipeline first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()

    import ray

    from benchmarks.lake import build_lake
    from engines import batch_inference as engine
    from engines.lake import Lake
    from engines.vector_store import VectorStore
    from ml.personalization import PersonalizationModel, TrainConfig, TwoTower, build_spec, labelled

    scratch = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    data_dir = args.data_dir or scratch / "lake"
    if args.data_dir is None:
        print("simulating 3 days and running the daily pipeline ...", flush=True)
        build_lake(data_dir)
    lake = Lake(data_dir)
    days = lake.partition_days("datasets", "personalization_training")
    day = days[-1]
    model = PersonalizationModel(TwoTower(build_spec(labelled(lake.scan_partitions(
        "datasets", "personalization_training", days).collect()), TrainConfig())))

    active = engine.active_users(lake, day)
    real = engine.entity_features(lake, day, model.spec.user.columns, "user_id", active).frame
    copies = -(-args.users // real.height)
    users = pl.concat([real.with_columns(pl.col("user_id") + i * 1_000_000) for i in range(copies)]).head(args.users)
    existing = engine.existing_items(lake, day)
    items = engine.entity_features(lake, day, model.spec.item.columns, "item_id", sorted(existing)).frame

    ray.init(num_cpus=args.workers, object_store_memory=400 * 1024 * 1024, include_dashboard=False,
             _temp_dir=str(Path(tempfile.gettempdir()) / "bench-ray"), log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    rates: dict[str, list[float]] = {"ray": [], "local": []}  # seconds per run
    with VectorStore.open(str(scratch / "vectors")) as store:
        radius = engine.index_items(store, model, items, "bench")
        print(f"{users.height} users, {items.height} items in the vector database, k={args.k}, "
              f"Ray Data with {args.workers} actors, {args.repeat} runs each after a warm-up", flush=True)
        for name in ("local", "ray"):
            for attempt in range(args.repeat + 1):
                started = time.perf_counter()
                out = engine.recommend(users, store, model, "bench", radius, args.k, engine=name,
                                       workers=args.workers, batch_size=256)
                elapsed = time.perf_counter() - started
                assert out.get_column("user_id").n_unique() == users.height
                if attempt:
                    rates[name].append(elapsed)
    ray.shutdown()
    print(f"{'pipeline':<26}{'median rows/s':>15}{'median s/run':>14}{'P99 s/run':>11}")
    for name, label in (("ray", "Ray Data (actor pool)"), ("local", "single-process loop")):
        median = statistics.median(rates[name])
        print(f"{label:<26}{users.height / median:>15,.0f}{median:>14.2f}{percentile(rates[name], 0.99):>11.2f}")
    print(f"ratio Ray Data / single process (median rows/s): "
          f"{statistics.median(rates['local']) / statistics.median(rates['ray']):.2f}")


if __name__ == "__main__":
    main()
