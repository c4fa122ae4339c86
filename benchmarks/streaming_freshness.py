"""Event-to-online-store latency of the streaming features, and the highest sustained event rate.

The simulator's streaming mode appends interaction files (events stamped with the wall clock);
the Flink job compiled from the DSL computes the streaming views (1-hour windows); the pusher
applies committed results with Feast's push path to a SQLite online store. An event's latency is
from the moment its file landed to the first push, for its user, of a value that counts it
(user_activity_realtime): a window end after it, or its live row.

Two settings of the job run one after the other, on the same rates:
- window-ends: values only at window ends, every 2 seconds, a checkpoint every second,
  files rolled every second, a 1 s watermark delay (the job before live rows);
- live: a live row per entity and millisecond with events (our LiveWindowFunction) beside window
  ends every 60 s, a checkpoint every 100 ms, files rolled every 50 ms, a 0.2 s watermark delay
  moved on every 50 ms. A live row waits for the watermark to pass its event, so the delay adds to
  its latency: choose it from the producers' disorder (--watermark-delay shows the trade).

Events behind the watermark are dropped as late; the late share of each rate is printed beside
its latencies (which cover only the events that count). Before the source read files in arrival
order, a job that lagged read newer files first and dropped a quarter of the events at 5,000/s.

Each rate runs --seconds long, --repeats times; figures are medians over repeats of each run's
P50/P99. With --warmup S, each job first takes S seconds of the highest rate, not measured: for its
first minute a job spends a core or more compiling (the JIT), and a job runs for days. A rate is
sustained when the job has read every event within 10 s of the producer stopping and P99 stays
under 3x the first rate's P99. A job that fell behind reads the rest of a run (up to 240 s) before
the next one starts, and its events' latencies count that wait ('>' marks figures of a run it had
still not read by then). The baseline is the naive path (at the lowest and
highest rate): re-read the last hour of event files with polars and push the recomputed view
whenever new files landed.

    .venv/bin/python benchmarks/streaming_freshness.py --rates 20 5000 20000 --seconds 10
        [--settings window-ends live] [--repeats 2] [--state-backend rocksdb] [--warmup 30]
        [--watermark-delay 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings  # noqa: E402
from engines.streaming import FlinkJob, OnlinePusher, SourceOptions, StreamingJobSettings  # noqa: E402
from feature_defs import catalogue  # noqa: E402
from feature_defs.compile.polars import build_rows_at  # noqa: E402
from simulator import Simulator, SimulatorConfig  # noqa: E402
from simulator.stream import EventStream  # noqa: E402

VIEW = "user_activity_realtime"
SCHEMA = {
    "event_id": pl.String,
    "event_timestamp": pl.String,
    "user_id": pl.Int64,
    "item_id": pl.Int64,
    "event_type": pl.String,
    "session_id": pl.String,
    "device": pl.String,
    "play_seconds": pl.Float64,
    "amount": pl.Float64,
}
DAY = date(2026, 1, 5)
DRAIN_SECONDS = 240  # how long a job that fell behind may take to read the rest of a run


@dataclass(frozen=True)
class JobSetting:
    live_rows: bool
    slide_seconds: int
    checkpoint_interval_ms: int
    sink_roll_ms: int
    watermark_delay_seconds: float
    watermark_interval_ms: int
    state_backend: str = "hashmap"


SETTINGS = {
    "window-ends": JobSetting(False, 2, 1000, 1000, 1, 200),
    "live": JobSetting(True, 60, 100, 50, 0.2, 50),
}


class Recorder:
    """Append times of events and push times of windows, per user."""

    def __init__(self):
        self.events: list[tuple[int, float, float]] = []  # (user, event time, appended at)
        self.pushes: dict[int, list[tuple[float, float]]] = defaultdict(list)  # user -> [(window_end, pushed_at)]
        self.rows_pushed: dict[str, int] = defaultdict(int)  # view -> rows written to the online store
        self.lock = threading.Lock()

    def on_file(self, path, appended_at, rows):
        # vectorised: this runs on the producer's thread, which shares the GIL with the pusher's
        times = (rows["event_timestamp"].cast(pa.int64()).to_numpy() / 1e6).tolist()
        with self.lock:
            self.events += [(u, t, appended_at) for u, t in zip(rows["user_id"].to_pylist(), times)]

    def on_push(self, view, rows, pushed_at):
        with self.lock:
            self.rows_pushed[view] += len(rows)
        if view != VIEW:
            return
        with self.lock:
            for row in rows:
                self.pushes[int(row["user_id"])].append((row["event_timestamp"].timestamp(), pushed_at))

    def latencies(self, since: float) -> list[float]:
        out = []
        with self.lock:
            for user, event_time, appended_at in self.events:
                if appended_at < since:
                    continue
                seen = [p for end, p in sorted(self.pushes[user]) if end > event_time and p >= appended_at]
                if seen:
                    out.append(min(seen) - appended_at)
        return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def flink_run(
    root: Path,
    stream: EventStream,
    store,
    rates: list[int],
    seconds: float,
    repeats: int,
    setting: JobSetting,
    warmup: float = 0,
) -> dict[int, dict]:
    job = FlinkJob(
        StreamingJobSettings(
            "interactions",
            root / "job",
            SourceOptions(path=str(stream.directory), monitor_seconds=0.1),
            slide_seconds=setting.slide_seconds,
            watermark_delay_seconds=setting.watermark_delay_seconds,
            checkpoint_interval_ms=setting.checkpoint_interval_ms,
            sink_roll_ms=setting.sink_roll_ms,
            watermark_interval_ms=setting.watermark_interval_ms,
            state_backend=setting.state_backend,
            live_rows=setting.live_rows,
        )
    )
    slide = setting.slide_seconds if not setting.live_rows else 1
    recorder = Recorder()
    pusher = OnlinePusher(store, job.spec(), on_push=recorder.on_push)
    stop = threading.Event()

    def push_loop():
        while not stop.is_set():
            pusher.poll()
            time.sleep(0.05)

    results: dict[int, dict] = {}
    pushing = threading.Thread(target=push_loop, daemon=True)
    job.start()
    try:
        job.wait_running(600)
        pushing.start()
        written = 0
        if warmup:  # the highest rate, not measured: the JIT compiles the hot paths under load
            written += stream.live(max(rates), warmup, DAY)
            _wait(lambda total=written: job.metrics()["records"] >= total, DRAIN_SECONDS)
            time.sleep(slide + 3)
            print(f"warmed up: {written} events at {max(rates)}/s", flush=True)
        for rate in rates:
            runs = []
            for _ in range(repeats):
                began, late_before = time.time(), job.metrics()["late"]
                appended = stream.live(rate, seconds, DAY, on_file=recorder.on_file)
                written += appended
                caught_up = _wait(lambda total=written: job.metrics()["records"] >= total, 10 + 2 * slide)
                # a job that fell behind reads the rest before the next run, which would otherwise
                # start behind; its events' latencies count that wait
                drained = caught_up or _wait(lambda total=written: job.metrics()["records"] >= total, DRAIN_SECONDS)
                time.sleep(slide + 3)  # the last windows close, commit and get pushed
                lat = recorder.latencies(began)
                runs.append(
                    {
                        "p50": percentile(lat, 0.5),
                        "p99": percentile(lat, 0.99),
                        "caught_up": caught_up,
                        "drained": drained,
                        "events": len(lat),
                        "late": job.metrics()["late"] - late_before,
                        "appended": appended,
                    }
                )
            results[rate] = {
                "p50": statistics.median(r["p50"] for r in runs),
                "p99": statistics.median(r["p99"] for r in runs),
                "caught_up": all(r["caught_up"] for r in runs),
                "drained": all(r["drained"] for r in runs),
                "events": sum(r["events"] for r in runs),
                "late": sum(r["late"] for r in runs),
                "appended": sum(r["appended"] for r in runs),
            }
            print(
                f"flink {'live' if setting.live_rows else 'window-ends'} rate {rate:>5}/s: P50 "
                f"{results[rate]['p50']:.2f}s  P99 {results[rate]['p99']:.2f}s  kept up: {results[rate]['caught_up']}"
                + ("" if results[rate]["drained"] else f"  (still behind {DRAIN_SECONDS}s later)"),
                flush=True,
            )
    finally:
        stop.set()
        if pushing.is_alive():  # the pusher's SQLite connection must not close under a running poll
            pushing.join()
        job.stop()
        pusher.close()
    print("rows pushed online per view:", dict(recorder.rows_pushed), flush=True)
    return results


def naive_run(root: Path, stream: EventStream, store, rate: int, seconds: float) -> dict:
    """After every new file: read the last hour of files with polars, recompute the view, push it all."""
    view = catalogue.view(VIEW)
    recorder = Recorder()
    seen: set[Path] = set()
    stop = threading.Event()

    def recompute_loop():
        while not stop.is_set():
            files = sorted(stream.directory.glob("events-*.jsonl"))
            if set(files) - seen:
                seen.update(files)
                events = pl.concat([pl.read_ndjson(f, schema=SCHEMA) for f in files])
                now = datetime.now(UTC)
                events = events.with_columns(pl.col("event_timestamp").str.to_datetime(time_zone="UTC"))
                rows = build_rows_at(view, events.lazy(), now).collect().to_pandas()  # the view at "now"
                rows["event_timestamp"] = now
                store.push(f"{VIEW}_push", rows, to=_online())
                pushed = rows.assign(event_timestamp=now + timedelta(seconds=1)).to_dict("records")
                recorder.on_push(VIEW, pushed, time.time())
            time.sleep(0.05)

    thread = threading.Thread(target=recompute_loop, daemon=True)
    thread.start()
    began = time.time()
    stream.live(rate, seconds, DAY, on_file=recorder.on_file)
    time.sleep(3)
    stop.set()
    thread.join()
    lat = recorder.latencies(began)
    return {"p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99), "events": len(lat)}


def _online():
    from feast.data_source import PushMode

    return PushMode.ONLINE


def _setting(name: str, args: argparse.Namespace) -> JobSetting:
    setting = replace(SETTINGS[name], state_backend=args.state_backend)
    if name == "live" and args.watermark_delay is not None:
        setting = replace(setting, watermark_delay_seconds=args.watermark_delay)
    return setting


def _wait(condition, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[20, 5000, 20000])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--state-backend", choices=["hashmap", "rocksdb"], default="hashmap")
    parser.add_argument(
        "--watermark-delay", type=float, default=None, help="live: the watermark delay in seconds (default 0.2)"
    )
    parser.add_argument(
        "--warmup", type=float, default=0, help="seconds at the highest rate before measuring (a job runs for days)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlplane-freshness-") as tmp:
        root = Path(tmp)
        engine = FeatureStoreEngine(FeatureStoreSettings(repo_dir=root / "repo", offline_root=root / "offline"))
        engine.apply()
        simulator = Simulator(SimulatorConfig(seed=3), root / "sim")
        results = {
            name: flink_run(
                root / f"flink-{name}",
                EventStream(simulator, root / f"flink-{name}" / "events"),
                engine.store,
                args.rates,
                args.seconds,
                args.repeats,
                _setting(name, args),
                args.warmup,
            )
            for name in args.settings
        }
        naive = {
            rate: naive_run(
                root / f"naive-{rate}",
                EventStream(simulator, root / f"naive-{rate}" / "events"),
                engine.store,
                rate,
                args.seconds,
            )
            for rate in dict.fromkeys([args.rates[0], args.rates[-1]])
        }
    print()
    print(
        f"event -> online store latency, user_activity_realtime "
        f"(medians of {args.repeats} runs of {args.seconds:.0f}s):"
    )
    print(f"{'setting':>12} {'rate/s':>8} {'P50 s':>8} {'P99 s':>8} {'kept up':>8} {'late':>12} {'P99/naive':>10}")
    for name, per_rate in results.items():
        for rate, v in per_rate.items():
            ratio = f"{v['p99'] / naive[rate]['p99']:.1f}x" if rate in naive else ""
            late = f"{v['late'] / max(v['appended'], 1):.1%}"
            mark = "" if v["drained"] else ">"  # lower bounds: some events were never pushed
            p50, p99 = (mark + format(v[q], ".2f") for q in ("p50", "p99"))
            cells = f"{p50:>8} {p99:>8} {str(v['caught_up']):>8} {late:>12}"
            print(f"{name:>12} {rate:>8} {cells} {ratio:>10}")
    for rate, v in naive.items():
        print(f"{'naive':>12} {rate:>8} {v['p50']:>8.2f} {v['p99']:>8.2f}")
    for name, per_rate in results.items():
        first = per_rate[args.rates[0]]
        sustained = [r for r, v in per_rate.items() if v["caught_up"] and v["p99"] <= 3 * max(first["p99"], 1.0)]
        print(f"{name}: highest sustained rate tried: {max(sustained) if sustained else 'none'} events/s")
    print(
        "naive: re-read the last hour of event files with polars and push the recomputed view after every "
        "new file (at the lowest and highest rate)"
    )


if __name__ == "__main__":
    main()
