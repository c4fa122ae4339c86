"""The online features' load: a range of offline days of `user_item_affinity` (the largest batch view:
one row per user and item) into an empty SQLite online store.

Feast's `FeatureStore.materialize` for the view (the load until 2026-12-05) and mlplane's
`FeatureStoreEngine.materialize_days` (the same rows through `OnlineWriter`: engines/features/online_write.py), on
the same random offline table (--pairs rows a day over --days days, as the demo's days grow), each into
its own store, in turn --repeats times. Figures are the median and P99 per load and the ratio.

    .venv/bin/python benchmarks/materialize.py --pairs 40000 --days 2 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings  # noqa: E402
from feature_defs import catalogue  # noqa: E402

VIEW = catalogue.view("user_item_affinity")
FIRST = date(2026, 3, 1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def write_offline(root: Path, pairs: int, days: int, rng: random.Random) -> None:
    """A partition a day, stamped at the day's end as the pipeline stamps it; counts and seconds."""
    for n in range(days):
        day = FIRST + timedelta(days=n)
        frame = pl.DataFrame(
            {
                "user_id": [rng.randrange(5_000) for _ in range(pairs)],
                "item_id": [rng.randrange(2_000) for _ in range(pairs)],
            }
        ).unique(["user_id", "item_id"])
        stamp = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
        frame = frame.with_columns(pl.lit(stamp).dt.cast_time_unit("us").alias("event_timestamp"))
        for feature in VIEW.features:
            if VIEW.dtype_of(feature) == "float64":
                values = [rng.random() * 600 for _ in range(frame.height)]
            else:
                values = [rng.randrange(20) for _ in range(frame.height)]
            frame = frame.with_columns(pl.Series(feature.name, values))
        folder = root / VIEW.name / f"date={day.isoformat()}"
        folder.mkdir(parents=True)
        frame.write_parquet(folder / "part-0.parquet")


def emptied(engine: FeatureStoreEngine) -> FeatureStoreEngine:
    with sqlite3.connect(engine.settings.repo_dir / "online_store.db") as db:
        db.execute(f'DELETE FROM "{engine.settings.project}_{VIEW.name}"')
    return engine


def feast_materialize(engine: FeatureStoreEngine, start: datetime, end: datetime) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its banner, bars
        emptied(engine).store.materialize(start, end, [VIEW.name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40_000, help="rows of the view a day")
    parser.add_argument("--days", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    last = FIRST + timedelta(days=args.days - 1)
    start = datetime.combine(FIRST, datetime.min.time(), tzinfo=UTC)
    end = datetime.combine(last + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    with tempfile.TemporaryDirectory(prefix="mlplane-materialize-") as tmp:
        offline = Path(tmp) / "offline"
        write_offline(offline, args.pairs, args.days, random.Random(11))
        engines = {}
        for name in ("feast", "mlplane"):
            engines[name] = FeatureStoreEngine(FeatureStoreSettings(repo_dir=Path(tmp) / name, offline_root=offline))
            engines[name].apply()
        ways = {
            "feast materialize": lambda: feast_materialize(engines["feast"], start, end),
            "mlplane materialize_days": lambda: emptied(engines["mlplane"]).materialize_days(FIRST, last, [VIEW]),
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        for repeat in range(args.repeats):
            for name, load in ways.items():  # in turn, so that drift hits both alike
                started = time.perf_counter()
                load()
                times[name].append(time.perf_counter() - started)
            print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()))
        rows = pl.scan_parquet(offline / VIEW.name / "*" / "*.parquet").select("user_id", "item_id").unique()
        print(f"{rows.collect().height} entities x {len(VIEW.features)} features over {args.days} days")
        print(f"{'load':>26} {'median s':>9} {'P99 s':>7}")
        for name, values in times.items():
            print(f"{name:>26} {statistics.median(values):>9.2f} {percentile(values, 0.99):>7.2f}")
        ratio = statistics.median(times["feast materialize"]) / statistics.median(times["mlplane materialize_days"])
        print(f"{'feast / ours (medians)':>26} {ratio:>9.1f}x")


if __name__ == "__main__":
    main()
