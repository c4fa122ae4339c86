"""Cost of an idle pusher poll (nothing new committed) as the streaming sink grows.

A live Flink job commits one result file per view, subtask and checkpoint. Kept forever, a day at
one commit per second leaves 86,400 files per view, and every poll (twice a second) lists them and
reads which were applied. The pusher deletes applied files an hour after their commit, so the sink
holds about 3,600 per view at that rate. Each size runs --repeats idle polls over the three
streaming views; figures are the median and P99 per poll, and the ratio of each size to the first.

    .venv/bin/python benchmarks/pusher_poll.py --files 3600 86400 --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.streaming import OnlinePusher  # noqa: E402
from feature_defs import catalogue  # noqa: E402
from feature_defs.compile.flink import SourceOptions, flink_job  # noqa: E402
from feature_defs.compile.streaming import streaming_plans  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def idle_polls(files: int, repeats: int, root: Path) -> list[float]:
    """Seconds per idle poll with `files` applied result files in every view's sink."""
    spec = flink_job("bench", streaming_plans(catalogue), SourceOptions(path="/unused"), str(root / "sink"))
    for info in spec.views.values():
        sink = Path(info.sink)
        sink.mkdir(parents=True)
        for i in range(files):
            (sink / f"part-{i:07d}").touch()  # empty files: the cost measured is listing, not reading rows
    pusher = OnlinePusher(None, spec)  # no store: an idle poll pushes nothing
    try:
        assert pusher.poll() == {"item_sales_today": 0, "item_trending": 0, "user_activity_realtime": 0}
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            assert pusher.poll() == {}
            seconds.append(time.perf_counter() - started)
        return seconds
    finally:
        pusher.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, nargs="+", default=[3600, 86400], help="files per view sink")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    print(f"{'files per view':>15}{'median ms/poll':>16}{'P99 ms/poll':>13}{'ratio (median)':>16}", flush=True)
    first = None
    for files in args.files:
        with tempfile.TemporaryDirectory(prefix="bench-pusher-") as scratch:
            seconds = idle_polls(files, args.repeats, Path(scratch))
        median = statistics.median(seconds)
        first = first or median
        print(
            f"{files:>15,}{median * 1000:>16.1f}{percentile(seconds, 0.99) * 1000:>13.1f}{median / first:>16.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
