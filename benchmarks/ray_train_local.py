"""A short training's cost on the in-process Ray: Ray Train with one worker against Ray Train's local mode
(`num_workers=0`: the training function in this process, ml/ray_train.py), the same TorchTrainer and
training function (a small torch model, --steps optimizer steps on one thread), in alternation --repeats
times. Figures per training: wall seconds and the machine's busy CPU-seconds (from /proc/stat: the worker
and Ray Train's helper actors are processes of their own), medians and P99, and the ratios.

    .venv/bin/python benchmarks/ray_train_local.py --steps 200 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ml.ray_train import fitted  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def busy_cpu_seconds() -> float:
    """The machine's non-idle CPU time so far (every process: Ray's actors are not this one's children)."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def train_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = ray.train.torch.prepare_model(layers)
    optimizer = torch.optim.AdamW(model.parameters())
    inputs, target = torch.randn(512, 64), torch.randn(512, 1)
    for _ in range(config["steps"]):
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ray.train.report({"loss": float(loss.detach())})


def one_training(workers: int, steps: int, storage: Path) -> tuple[float, float]:
    from ray.train import ScalingConfig

    cpu, started = busy_cpu_seconds(), time.perf_counter()
    scaling = ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1})
    with fitted(train_loop, {"steps": steps}, scaling, storage, f"bench-{workers}"):
        pass
    return time.perf_counter() - started, busy_cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps of each training")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import logging

    import ray

    from resources.ray import RayResource

    with tempfile.TemporaryDirectory(prefix="mlplane-ray-train-") as tmp:
        RayResource(temp_dir=str(Path(tmp) / "ray"), log_to_driver=False).ensure_started()
        logging.getLogger("ray.train").setLevel(logging.WARNING)
        ways = {"ray train, 1 worker": 1, "ray train, local mode": 0}
        wall: dict[str, list[float]] = {name: [] for name in ways}
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        for repeat in range(args.repeats):
            for name, workers in ways.items():  # alternating, so that drift hits both alike
                seconds, busy = one_training(workers, args.steps, Path(tmp) / "storage")
                wall[name].append(seconds)
                cpu[name].append(busy)
            print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{n} {wall[n][-1]:.2f} s" for n in ways))
        ray.shutdown()
    print(f"{'training':>24} {'median s':>9} {'P99 s':>7} {'median CPU-s':>13} {'P99 CPU-s':>10}")
    for name in ways:
        print(
            f"{name:>24} {statistics.median(wall[name]):>9.2f} {percentile(wall[name], 0.99):>7.2f} "
            f"{statistics.median(cpu[name]):>13.1f} {percentile(cpu[name], 0.99):>10.1f}"
        )
    worker, local = "ray train, 1 worker", "ray train, local mode"
    print(
        f"{'worker / local (medians)':>24} {statistics.median(wall[worker]) / statistics.median(wall[local]):>9.1f}x "
        f"{'':>7} {statistics.median(cpu[worker]) / max(statistics.median(cpu[local]), 0.01):>12.1f}x"
    )


if __name__ == "__main__":
    main()
