"""Answer-to-next-item round trip of the labeling app under concurrent simulated annotators.

Each simulated annotator is its own HTTP client (like a browser) and loops: POST an answer, which
returns the next item. The round trip is timed from sending the answer to having the next item.
The app runs in uvicorn (one process, as `mlplane labeling serve` does) on SQLite by default or on
a PostgreSQL URL. Label Studio is not measured: it does not install beside our pins and was not set
up in an environment of its own here (see the README).

    .venv/bin/python benchmarks/labeling.py --annotators 20 --items 500
    .venv/bin/python benchmarks/labeling.py --database postgresql+psycopg2://postgres@127.0.0.1:5432/bench
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.simulator.annotators import SimulatedAnnotator, run_concurrently  # noqa: E402
from ground_truth import accounts, queue  # noqa: E402
from ground_truth.db import connect  # noqa: E402
from ground_truth.schema import ItemIn, Role, TaskSpec  # noqa: E402
from ground_truth.server import serve_app  # noqa: E402

PASSWORD = "benchmark-pass"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def prepare(url: str, annotators: int, items: int, k: int) -> dict[str, str]:
    engine = connect(url)
    for i in range(annotators):
        accounts.create_account(engine, f"bench{i}", PASSWORD, Role.annotator)
    task = queue.create_task(engine, TaskSpec(name="bench", question="Copy?", labels=["violation", "ok"],
                                              annotators_per_item=k, gold_share=0.1))
    queue.add_items(engine, task, [ItemIn(key=str(i), queue="audit", title=f"item {i}",
                                          gold_label="ok" if i % 50 == 0 else None) for i in range(items)])
    engine.dispose()
    return {str(i): "violation" if i % 7 == 0 else "ok" for i in range(items)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("-k", type=int, default=3, help="annotators per item")
    parser.add_argument("--database", default=None, help="SQLAlchemy URL of an EMPTY database (default: SQLite)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="labeling-bench-") as work:
        url = args.database or f"sqlite:///{Path(work) / 'labels.db'}"
        truth = prepare(url, args.annotators, args.items, args.k)
        people = [SimulatedAnnotator(f"bench{i}", PASSWORD, 0.9, seed=i) for i in range(args.annotators)]
        with serve_app(url) as base_url:
            started = time.perf_counter()
            answers = sum(run_concurrently([lambda p=p: p.label_all(base_url, "bench", truth) for p in people]))
            seconds = time.perf_counter() - started
    trips = [t * 1000 for p in people for t in p.round_trips]
    backend = url.split(":")[0]
    print(f"labeling app ({backend}), {args.annotators} concurrent annotators, {args.items} items, k={args.k}: "
          f"{answers} answers in {seconds:.1f} s ({answers / seconds:.0f} answers/s)")
    print(f"answer-to-next-item round trip: median {statistics.median(trips):.1f} ms, "
          f"P99 {percentile(trips, 0.99):.1f} ms, max {max(trips):.1f} ms")
    print("Label Studio: not measured (no environment of its own on this machine; see README)")


if __name__ == "__main__":
    main()
