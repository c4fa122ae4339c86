"""The streaming pusher's write: a batch of one view's rows into the SQLite online store.

Feast's `FeatureStore.push` to the view's PushSource (the pusher's write until 2026-12-04), Feast's
`write_to_online_store` for the view, and mlplane's `OnlineWriter` (engines/features/online_write.py, the
pusher's write now), each on the same random rows of `user_activity_realtime` (the live view the
freshness benchmark follows), in turn, --repeats times per batch size. Figures are the median and
P99 per batch and the ratio of Feast's push to ours.

    .venv/bin/python benchmarks/online_write.py --rows 50 250 1000 --repeats 40
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings  # noqa: E402
from engines.features.online_write import OnlineWriter  # noqa: E402

VIEW = "user_activity_realtime"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def batch(rng: random.Random, n: int) -> list[dict]:
    now = datetime.now(UTC)
    return [
        {
            "user_id": rng.randrange(5_000),
            "event_timestamp": now - timedelta(milliseconds=rng.randrange(1_000)),
            "impressions_1h": rng.randrange(50),
            "clicks_1h": rng.randrange(10),
            "plays_1h": rng.randrange(10),
            "ctr_1h": rng.choice([None, rng.random()]),
            "last_played_items_1h": [rng.randrange(10_000) for _ in range(rng.randrange(6))],
        }
        for _ in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[50, 250, 1000])
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    from feast.data_source import PushMode

    with tempfile.TemporaryDirectory(prefix="mlplane-online-write-") as tmp:
        engine = FeatureStoreEngine(FeatureStoreSettings(repo_dir=Path(tmp) / "repo", offline_root=Path(tmp) / "off"))
        engine.apply()
        store, writer = engine.store, OnlineWriter(engine.store, VIEW)
        ways = {
            "feast push": lambda rows: store.push(f"{VIEW}_push", pd.DataFrame(rows), to=PushMode.ONLINE),
            "feast write_to_online_store": lambda rows: store.write_to_online_store(VIEW, pd.DataFrame(rows)),
            "mlplane OnlineWriter": writer.write,
        }
        rng = random.Random(5)
        print(f"{'rows':>6} {'write':>28} {'median ms':>10} {'P99 ms':>8}")
        for n in args.rows:
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.repeats):
                rows = batch(rng, n)
                for name, write in ways.items():  # in turn, so that drift hits all alike
                    started = time.perf_counter()
                    write(rows)
                    times[name].append((time.perf_counter() - started) * 1000)
            for name, values in times.items():
                print(f"{n:>6} {name:>28} {statistics.median(values):>10.2f} {percentile(values, 0.99):>8.2f}")
            ratio = statistics.median(times["feast push"]) / statistics.median(times["mlplane OnlineWriter"])
            print(f"{n:>6} {'push / ours (medians)':>28} {ratio:>10.1f}x")


if __name__ == "__main__":
    main()
