"""Start-up cost of Feast in a new process: Feast as shipped (typeguard instruments its classes at
import) against Feast imported through our packages (`feature_defs.compile.feast_typechecks`). Each
side runs --repeats new interpreters, alternating; figures are the median and P99 wall seconds and
the ratio.

    .venv/bin/python benchmarks/feast_import.py --repeats 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDES = {
    "feast as shipped": "import feast",
    "feast through mlplane": "import feature_defs.compile; import feast",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def seconds(code: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLPLANE_FEAST_TYPECHECKS", None)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    for code in SIDES.values():  # compiled bytecode cached before timing
        seconds(code)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(args.repeats):
        for side, code in SIDES.items():
            times[side].append(seconds(code))
            print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"{'new process, import':<24} {'median s':>9} {'P99 s':>7}")
    for side, values in times.items():
        print(f"{side:<24} {statistics.median(values):>9.2f} {percentile(values, 0.99):>7.2f}")
    ours, peer = (statistics.median(times[side]) for side in ("feast through mlplane", "feast as shipped"))
    print(f"ratio (mlplane / as shipped, medians): {ours / peer:.2f}x")


if __name__ == "__main__":
    main()
