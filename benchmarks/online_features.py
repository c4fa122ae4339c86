"""Online feature reads: mlplane's read path against Feast's own `feast serve`, same store, same run.

Reads one feature service (personalization_ranking: 7 views, 49 features) for 1 and for 100
(user, item) entity rows, REPEAT times each, and prints P50 and P99 latencies side by side:
mlplane's OnlineReader (in-process), Feast's Python SDK (in-process), `feast serve` (HTTP) and the
model server's `POST /get-online-features` (HTTP, `mlplane serve models`); then requests/s of both
HTTP servers at 32 connections.

  .venv/bin/python benchmarks/online_features.py [--data-dir DIR] [--repeat 500]

Without --data-dir it simulates 3 days in a temporary folder and runs the daily pipeline first.
"""

from __future__ import annotations

import argparse
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
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from assets import all_assets
    from engines.simulator import simulate
    from jobs import daily_assets
    from orchestration.profiles import resources_for

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
    server = subprocess.Popen(
        [str(feast), "-c", str(engine.settings.repo_dir), "serve", "-p", str(port), "--no-access-log", "-w", "1"],
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
            body = {
                "feature_service": SERVICE,
                "full_feature_names": True,
                "entities": {k: [r[k] for r in rows] for k in ("user_id", "item_id")},
            }
            response = client.post("/get-online-features", json=body)
            response.raise_for_status()
            return response.json()

        def via_mlplane(rows):
            return engine.online_features(SERVICE, rows)

        def via_feast_sdk(rows):
            return engine.online_features_via_feast(SERVICE, rows)

        # the same answers from both, before timing anything
        check = workloads[100][0]
        served = via_feast_serve(check)
        ours = via_mlplane(check)
        names = served["metadata"]["feature_names"]
        clicks = "user_engagement__clicks_7d"
        assert ours[clicks] == served["results"][names.index(clicks)]["values"]

        print(f"\nonline reads of feature service {SERVICE!r}, SQLite online store, {args.repeat} reads each")
        print(f"{'entities':>8}  {'path':<34} {'P50 ms':>8} {'P99 ms':>8} {'P50 ratio':>10} {'P99 ratio':>10}")
        ours = client.base_url.copy_with(port=model_server_port)

        def via_model_server(rows):
            body = {
                "feature_service": SERVICE,
                "full_feature_names": True,
                "entities": {k: [r[k] for r in rows] for k in ("user_id", "item_id")},
            }
            response = client.post(ours.join("/get-online-features"), json=body)
            response.raise_for_status()
            return response.json()

        mine = via_model_server(check)  # a view's features may come in another order: match by name
        assert (
            mine["results"][mine["metadata"]["feature_names"].index(clicks)] == served["results"][names.index(clicks)]
        )
        paths = [
            ("mlplane OnlineReader (in-process)", via_mlplane),
            ("Feast SDK (in-process)", via_feast_sdk),
            ("feast serve (HTTP, 1 worker)", via_feast_serve),
            ("mlplane serve models (HTTP)", via_model_server),
        ]
        for n, batches in workloads.items():
            base = None
            for name, fn in paths:
                p50, p99 = percentiles(timed(fn, batches))
                base = base or (p50, p99)
                print(f"{n:>8}  {name:<34} {p50:>8.2f} {p99:>8.2f} {p50 / base[0]:>9.2f}x {p99 / base[1]:>9.2f}x")
        body = {"feature_service": SERVICE, "full_feature_names": True, "entities": {"user_id": [3], "item_id": [5]}}
        rates = {
            name: requests_per_second(f"{url}/get-online-features", body, 32, args.repeat)
            for name, url in [("feast serve", f"http://127.0.0.1:{port}"), ("mlplane serve models", str(ours))]
        }
        print(
            "\none entity at 32 connections: "
            + ", ".join(f"{k} {v[0]:.0f} req/s ({v[1]} errors)" for k, v in rates.items())
            + f"; ratio {rates['mlplane serve models'][0] / rates['feast serve'][0]:.2f}x"
        )
        print("measured on a shared machine under load from other work")
    finally:
        for process in (server, model_server):
            process.terminate()
            process.wait(timeout=30)


def requests_per_second(url: str, body: dict, connections: int, requests: int) -> tuple[float, int]:
    """Answered requests per second and how many answers were errors (feast serve answers some 500s)."""
    import asyncio

    async def run() -> tuple[float, int]:
        left, errors = list(range(requests)), []
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=connections)) as client:

            async def worker():
                while left:
                    left.pop()
                    try:
                        response = await client.post(url, json=body)
                        if response.status_code >= 400:
                            errors.append(f"{response.status_code} {response.text[:200]}")
                    except httpx.TransportError as error:  # a dropped connection counts as an error answer
                        errors.append(repr(error))

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(connections)))
            if errors:
                print(f"{url}: {len(errors)} errors, first: {errors[0]}")
            return requests / (time.perf_counter() - started), len(errors)

    return asyncio.run(run())


if __name__ == "__main__":
    main()
