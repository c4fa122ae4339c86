"""Batch inference throughput: the Ray Data pipeline against a plain single-process loop, same model,
same users, same vector database, same run.

Both compute every user's vector with the two-tower model and retrieve the user's top-k items from
the vector database (engines/models/batch_inference.py: engine="ray", tasks that each hold the model and a
read-only copy of the index shipped through the object store; engine="local", one process with the
same torch threads as Ray has CPUs). Users are the active users of the newest simulated day, tiled
under new ids to --users rows. The model is built from the real training set's spec with untrained
weights: speed does not depend on the weights. Every Ray run ships the model and the index again, as
a daily batch job does; the first run of each side (worker start, imports) is reported apart.
Prints median rows/s, median and P99 seconds per run over --repeat runs and the ratio.

  .venv/bin/python benchmarks/batch_inference.py [--data-dir DIR] [--users 100000] [--repeat 5] [--ray-cpus 2]

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
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()

    import ray

    from benchmarks.lake import build_lake
    from engines.data.lake import Lake
    from engines.models import batch_inference as engine
    from engines.retrieval.vector_store import VectorStore
    from ml.personalization import PersonalizationModel, TrainConfig, TwoTower, build_spec, labelled

    scratch = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    data_dir = args.data_dir or scratch / "lake"
    if args.data_dir is None:
        print("simulating 3 days and running the daily pipeline ...", flush=True)
        build_lake(data_dir)
        ray.shutdown()  # the pipeline's geometry job started Ray in this process; ours gets its own CPUs
    lake = Lake(data_dir)
    days = lake.partition_days("datasets", "personalization_training")
    day = days[-1]
    model = PersonalizationModel(
        TwoTower(
            build_spec(
                labelled(lake.scan_partitions("datasets", "personalization_training", days).collect()), TrainConfig()
            )
        )
    )

    active = engine.active_users(lake, day)
    real = engine.entity_features(lake, day, model.spec.user.columns, "user_id", active).frame
    copies = -(-args.users // real.height)
    users = pl.concat([real.with_columns(pl.col("user_id") + i * 1_000_000) for i in range(copies)]).head(args.users)
    existing = engine.existing_items(lake, day)
    items = engine.entity_features(lake, day, model.spec.item.columns, "item_id", sorted(existing)).frame

    import torch

    torch.set_num_threads(args.ray_cpus)  # the single process gets the CPUs Ray has
    ray.init(
        num_cpus=args.ray_cpus,
        object_store_memory=400 * 1024 * 1024,
        include_dashboard=False,
        _temp_dir=tempfile.mkdtemp(prefix="bench-ray", dir="/tmp"),
        log_to_driver=False,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    seconds: dict[str, list[float]] = {"ray": [], "local": []}
    with VectorStore.open(str(scratch / "vectors")) as store:
        radius = engine.index_items(store, model, items, "bench")
        print(
            f"{users.height} users, {items.height} items in the vector database, k={args.k}, "
            f"{args.ray_cpus} Ray CPUs (tasks), {args.repeat} runs each after a cold one, alternating",
            flush=True,
        )
        for _ in range(args.repeat + 1):
            for name in ("local", "ray"):  # alternate, so that other load on the machine hits both
                started = time.perf_counter()
                out = engine.recommend(users, store, model, "bench", radius, args.k, engine=name)
                seconds[name].append(time.perf_counter() - started)
                assert out.get_column("user_id").n_unique() == users.height
    ray.shutdown()
    print(f"{'pipeline':<26}{'median rows/s':>15}{'median s/run':>14}{'P99 s/run':>11}{'cold s':>9}")
    for name, label in (("ray", "Ray Data (tasks)"), ("local", "single-process loop")):
        cold, *warm = seconds[name]
        median = statistics.median(warm)
        print(f"{label:<26}{users.height / median:>15,.0f}{median:>14.2f}{percentile(warm, 0.99):>11.2f}{cold:>9.2f}")
    print(
        f"ratio Ray Data / single process (median rows/s): "
        f"{statistics.median(seconds['local'][1:]) / statistics.median(seconds['ray'][1:]):.2f}"
    )


if __name__ == "__main__":
    main()
