"""Online feature reads: mlplane's read path against Feast's own `feast serve`, same store, same run.

Reads one feature service (personalization_ranking: 8 views, 57 features) for 1 and for 100
(user, item) entity rows, REPEAT times each, and prints P50 and P99 latencies side by side:
mlplane's OnlineReader (in-process), Feast's Python SDK (in-process), `feast serve` (HTTP) and the
model server's `POST /get-online-features` (HTTP, `mlplane serve models`, which answers through
mlplane's read path with `feast serve`'s JSON: checked equal before timing), with their ratios to
`feast serve`; then requests/s of both HTTP servers at 32 connections, and their ratio. The machine's
load average is printed before and after: the load generator runs on the same cores.

  .venv/bin/python benchmarks/online_features.py [--data-dir DIR] [--repeat 500]

Without --data-dir it simulates 3 days in a temporary folder and runs the daily pipeline first.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import httpx
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SERVICE = "personalization_ranking"


def build_lake(data_dir: Path) -> None:
    from dagster import DagsterInstance, materialize

    from assets import all_assets
    from jobs import daily_assets
    from orchestration.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
    from orchestration.profiles import resources_for
    from simulator import simulate

    first = date(2026, 1, 1)
    print(f"building a lake in {data_dir}: 3 simulated days, then the daily pipeline ...", flush=True)
    simulate(data_dir, 3, start_date=first)
    materialize(
        all_assets,
        selection=daily_assets,
        resources=resources_for("local", data_dir=str(data_dir)),
        instance=DagsterInstance.ephemeral(),
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        tags={
            ASSET_PARTITION_RANGE_START_TAG: first.isoformat(),
            ASSET_PARTITION_RANGE_END_TAG: (first + timedelta(days=2)).isoformat(),
        },
    )


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return statistics.median(ordered) * 1000, p99 * 1000


def timed(fn, batches: list, warmup: int = 20) -> list[float]:
    for rows in batches[:warmup]:
        fn(rows)
    samples = []
    for rows in batches:
        start = time.perf_counter()
        fn(rows)
        samples.append(time.perf_counter() - start)
    return samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--repeat", type=int, default=500)
    args = parser.parse_args()

    from orchestration.profiles import resources_for

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="mlplane-bench-"))
    engine = resources_for("local", data_dir=str(data_dir))["feature_store"].get_client()
    if not (data_dir / "feature_repo" / "online_store.db").exists():
        build_lake(data_dir)
    engine.write_repo()

    affinity = pl.read_parquet(data_dir / "offline" / "user_item_affinity" / "*" / "*.parquet")
    pairs = affinity.select("user_id", "item_id")
    pairs = [dict(zip(("user_id", "item_id"), r)) for r in pairs.unique().rows()]
    rng = random.Random(0)
    workloads = {n: [rng.sample(pairs, n) for _ in range(args.repeat)] for n in (1, 100)}

    port = free_port()
    feast = Path(sys.executable).with_name("feast")
    # one worker, as the model server runs one process; no worker restart within the run (its default
    # restarts the worker after about 1000 requests, which resets every open connection mid-measure)
    serve = ["serve", "-p", str(port), "--no-access-log", "-w", "1", "--max-requests", "1000000"]
    server = subprocess.Popen(
        [str(feast), "-c", str(engine.settings.repo_dir), *serve],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "FEAST_USAGE": "False"},
    )
    model_server_port = free_port()
    config = data_dir / "features_server.yaml"
    config.write_text(f"lake_root: {data_dir}\nvector_store: {data_dir / 'bench_features_vectors'}\nmodels: []\n")
    model_server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.models",
            "--config",
            str(config),
            "--port",
            str(model_server_port),
            "--grpc-port",
            "0",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(data_dir / "features_server.log").open("w"),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        for _ in range(240):
            try:
                if httpx.get(f"http://127.0.0.1:{model_server_port}/v2/health/live").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        for _ in range(120):
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            raise RuntimeError("feast serve did not start")

        def via_feast_serve(rows):
            response = client.post("/get-online-features", json=request_body(rows))
            response.raise_for_status()
            return response.json()

        def via_mlplane(rows):
            return engine.online_features(SERVICE, rows)

        def via_feast_sdk(rows):
            return engine.online_features_via_feast(SERVICE, rows)

        ours = client.base_url.copy_with(port=model_server_port)

        def via_model_server(rows):
            response = client.post(ours.join("/get-online-features"), json=request_body(rows))
            response.raise_for_status()
            return response.json()

        # the same answers, before timing anything: the whole JSON of each feature (a view's features may
        # come in another order from each server: Feast keeps them in a set), and the in-process reader
        check = workloads[100][0] + workloads[1][0]
        served, mine = via_feast_serve(check), via_model_server(check)
        assert by_feature(mine) == by_feature(served) and list(mine) == list(served), "answers differ"
        clicks = "user_engagement__clicks_7d"
        assert via_mlplane(check)[clicks] == by_feature(served)[clicks]["values"]

        # the load generator holds Feast's SDK and the lake's frames: its own garbage collections would
        # land in the servers' latencies, so what exists now is left out of them
        gc.collect()
        gc.freeze()
        print(f"\nonline reads of feature service {SERVICE!r}, SQLite online store, {args.repeat} reads each")
        print(f"load average before: {load()}")
        print(f"{'entities':>8}  {'path':<34} {'P50 ms':>8} {'P99 ms':>8} {'P50 vs feast serve':>19} {'P99 vs':>7}")
        paths = [
            ("mlplane OnlineReader (in-process)", via_mlplane),
            ("Feast SDK (in-process)", via_feast_sdk),
            ("feast serve (HTTP, 1 worker)", via_feast_serve),
            ("mlplane serve models (HTTP)", via_model_server),
        ]
        for n, batches in workloads.items():
            figures = {name: percentiles(timed(fn, batches)) for name, fn in paths}
            peer = figures["feast serve (HTTP, 1 worker)"]
            for name, (p50, p99) in figures.items():
                print(f"{n:>8}  {name:<34} {p50:>8.2f} {p99:>8.2f} {p50 / peer[0]:>18.2f}x {p99 / peer[1]:>6.2f}x")
        bodies = [request_body(rows) for rows in workloads[1]]
        count = max(200, 10 * args.repeat)
        rates = {
            name: requests_per_second(f"{url}/get-online-features", bodies, 32, count)
            for name, url in [("feast serve", f"http://127.0.0.1:{port}"), ("mlplane serve models", str(ours))]
        }
        print(
            f"\none entity at 32 connections ({count} requests, random entities): "
            + ", ".join(f"{k} {v[0]:.0f} req/s ({v[1]} errors)" for k, v in rates.items())
            + f"; ratio {rates['mlplane serve models'][0] / rates['feast serve'][0]:.2f}x"
        )
        print(f"load average after: {load()} ({os.cpu_count()} CPUs; the load generator shares them)")
    finally:
        for process in (server, model_server):
            process.terminate()
            process.wait(timeout=30)


def request_body(rows: list[dict]) -> dict:
    return {
        "feature_service": SERVICE,
        "full_feature_names": True,
        "entities": {k: [r[k] for r in rows] for k in ("user_id", "item_id")},
    }


def by_feature(answer: dict) -> dict:
    return dict(zip(answer["metadata"]["feature_names"], answer["results"]))


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"


def requests_per_second(url: str, bodies: list[dict], connections: int, requests: int) -> tuple[float, int]:
    """Answered requests per second over `connections` keep-alive connections, and how many answers were
    errors (feast serve answered some 500s). The client is a few lines of asyncio over pre-encoded
    HTTP/1.1 requests: httpx's own CPU capped it near 450 req/s here, even on a trivial endpoint."""
    import asyncio
    import json
    import re
    from urllib.parse import urlsplit

    where = urlsplit(url)
    head = f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
    encoded = [json.dumps(b).encode() for b in bodies]
    payloads = [f"{head}Content-Length: {len(b)}\r\n\r\n".encode() + b for b in encoded]
    length = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")

    async def connection(left: list, errors: list) -> None:
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        while left:
            i = left.pop()
            try:
                writer.write(payloads[i % len(payloads)])
                answer = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(int(length.search(answer).group(1)))
                if int(answer.split(b" ", 2)[1]) >= 400:
                    errors.append(f"{answer.split(b' ', 2)[1].decode()} {body[:200]!r}")
            except (OSError, asyncio.IncompleteReadError) as error:  # a dropped connection: an error answer
                errors.append(repr(error))
                writer.close()
                reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.close()

    async def run(count: int) -> tuple[float, int]:
        left, errors = list(range(count)), []
        started = time.perf_counter()
        await asyncio.gather(*(connection(left, errors) for _ in range(connections)))
        seconds = time.perf_counter() - started
        if errors:
            print(f"{url}: {len(errors)} errors, first: {errors[0]}")
        return count / seconds, len(errors)

    asyncio.run(run(4 * connections))  # warm up
    return asyncio.run(run(requests))


if __name__ == "__main__":
    main()
