"""Online serving: mlplane's model server against KServe's own Python model server, same model, same
machine, same run. OIP v2 JSON infer of the personalization user tower at 1 and 32 connections (both
servers), and `recommend` end to end (online features, user tower, vector DB, rerank; ours only:
KServe has no such path). Prints P50, P99, requests/s and server CPU per request, and the ratios.

  .venv/bin/python benchmarks/online_serving.py [--data-dir DIR] [--requests 400] [--device cpu|cuda]

Without --data-dir it simulates 3 days and runs the daily pipeline (benchmarks/online_features.py's
lake). The model is the two-tower built from that lake's training set with random weights (speed does
not depend on training). The KServe peer runs from `.venv-kserve` (scripts: see README) when present.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KSERVE_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"

from benchmarks.online_features import build_lake, free_port  # noqa: E402


def kserve_installed() -> bool:
    return (
        KSERVE_PYTHON.exists()
        and subprocess.run([str(KSERVE_PYTHON), "-c", "import kserve"], capture_output=True).returncode == 0
    )


def spec_frame(data_dir: Path):
    """Rows with the towers' columns for `build_spec`: the training set where the lake has one, else each
    tower view's rows of every day side by side (weights are random: speed needs the columns, not labels).
    The daily pipeline alone writes no training set (it needs the streaming history, a Flink backfill)."""
    import polars as pl

    from ml.personalization import ITEM_INPUTS, LABEL, USER_INPUTS, labelled

    if list(data_dir.glob("datasets/*/*/*.parquet")):
        return labelled(pl.read_parquet(data_dir / "datasets" / "*" / "*" / "*.parquet"))

    def rows(views: tuple[str, ...], key: str) -> pl.DataFrame:
        frame = None
        for view in views:
            table = pl.read_parquet(data_dir / "offline" / view / "*" / "*.parquet").drop("event_timestamp")
            table = table.unique(key, keep="last").rename({c: f"{view}__{c}" for c in table.columns if c != key})
            frame = table if frame is None else frame.join(table, on=key, how="left")
        return frame

    users = rows(tuple(i.view for i in USER_INPUTS), "user_id")
    items = rows(tuple(i.view for i in ITEM_INPUTS), "item_id")
    n = min(users.height, items.height)
    return pl.concat([users.head(n), items.head(n)], how="horizontal").with_columns(pl.lit(0.0).alias(LABEL))


def register_model(data_dir: Path) -> Path:
    """The personalization towers over the lake's training-set columns, random weights, as champion."""
    import torch

    from engines.registry import ModelRegistry
    from ml.personalization import PersonalizationModel, TrainConfig, TwoTower, build_spec

    registry = ModelRegistry.local(data_dir / "bench_registry")
    folder = data_dir / "bench_model"
    if registry.by_alias("personalization", "champion") is None:
        frame = spec_frame(data_dir)
        torch.manual_seed(0)
        PersonalizationModel(TwoTower(build_spec(frame, TrainConfig()))).save(folder)
        version = registry.register(
            "personalization", folder, {"mlplane.feature_service": "personalization_ranking"}, {}
        )
        registry.set_alias("personalization", "champion", version.version, who="benchmark", reason="benchmark")
    return folder


def start(command: list[str], url: str, env: dict | None = None) -> subprocess.Popen:
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[:3]} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children that were waited for (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


async def drive(url: str, body: dict, requests: int, connections: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    queue = list(range(requests))
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for _ in range(20):  # warm up
            (await client.post(url, json=body)).raise_for_status()

        async def worker() -> None:
            while queue:
                queue.pop()
                started = time.perf_counter()
                response = await client.post(url, json=body)
                latencies.append(time.perf_counter() - started)
                response.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return latencies, time.perf_counter() - started


def measure(name: str, url: str, body: dict, pid: int, requests: int, connections: int) -> dict:
    before = cpu_seconds(pid)
    latencies, wall = asyncio.run(drive(url, body, requests, connections))
    cpu = cpu_seconds(pid) - before
    ordered = sorted(latencies)
    return {
        "server": name,
        "connections": connections,
        "p50": statistics.median(ordered) * 1000,
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1000,
        "rps": len(latencies) / wall,
        "cpu_ms": cpu / len(latencies) * 1000,
    }


def infer_body(model_dir: Path) -> dict:
    from ml.personalization import ModelSpec

    spec = ModelSpec.from_json((model_dir / "model.json").read_text()).user
    inputs = [{"name": spec.id_column, "datatype": "INT64", "shape": [1], "data": [7]}]
    inputs += [{"name": c, "datatype": "FP64", "shape": [1], "data": [1.0]} for c in spec.numeric]
    inputs += [{"name": c, "datatype": "BYTES", "shape": [1], "data": ["eu"]} for c in spec.categorical]
    inputs += [{"name": c, "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]} for c in spec.histories]
    return {"inputs": inputs}


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'server':<28}{'conns':>6}{'P50 ms':>9}{'P99 ms':>9}{'req/s':>9}{'CPU ms/req':>12}")
    for r in rows:
        print(
            f"{r['server']:<28}{r['connections']:>6}{r['p50']:>9.2f}{r['p99']:>9.2f}{r['rps']:>9.0f}"
            f"{r['cpu_ms']:>12.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="mlplane-serving-bench-"))
    if not (data_dir / "feature_repo" / "online_store.db").exists():
        build_lake(data_dir)
    model_dir = register_model(data_dir)
    config = {
        "registry_root": str(data_dir / "bench_registry"),
        "lake_root": str(data_dir),
        "device": args.device,
        "feature_log_sample": 0.0,
        "vector_store": str(data_dir / "bench_vectors"),
        "models": [{"name": "personalization", "registry_model": "personalization", "kind": "two_tower"}],
    }
    config_path = data_dir / "bench_server.yaml"
    config_path.write_text(yaml.safe_dump(config))
    ours_port, kserve_port = free_port(), free_port()
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ours = start(
        [
            sys.executable,
            "-m",
            "serving.models",
            "--config",
            str(config_path),
            "--port",
            str(ours_port),
            "--grpc-port",
            "0",
            "--log-level",
            "warning",
        ],
        f"http://127.0.0.1:{ours_port}/v2/health/ready",
        env,
    )
    peers = []
    try:
        body = infer_body(model_dir)
        infer_rows, recommend_rows = [], []
        if kserve_installed():
            peers.append(
                start(
                    [
                        str(KSERVE_PYTHON),
                        "benchmarks/kserve_towers.py",
                        "--model_dir",
                        str(model_dir),
                        "--http_port",
                        str(kserve_port),
                        "--grpc_port",
                        str(free_port()),
                    ],
                    f"http://127.0.0.1:{kserve_port}/v2/health/ready",
                    env,
                )
            )
        else:
            print(f"KServe peer skipped: no kserve in {KSERVE_PYTHON} (see README: Online model server)")
        for connections in (1, 32):
            infer_rows.append(
                measure(
                    "mlplane serving/models",
                    f"http://127.0.0.1:{ours_port}/v2/models/personalization/infer",
                    body,
                    ours.pid,
                    args.requests,
                    connections,
                )
            )
            if peers:
                infer_rows.append(
                    measure(
                        "KServe ModelServer",
                        f"http://127.0.0.1:{kserve_port}/v2/models/personalization/infer",
                        body,
                        peers[0].pid,
                        args.requests,
                        connections,
                    )
                )
            recommend_rows.append(
                measure(
                    "mlplane recommend",
                    f"http://127.0.0.1:{ours_port}/recommend",
                    {"user_id": 7, "k": 10},
                    ours.pid,
                    args.requests,
                    connections,
                )
            )
        print_rows(f"OIP v2 JSON infer, personalization user tower, {args.requests} requests", infer_rows)
        if peers:
            for ours_row, peer_row in zip(infer_rows[0::2], infer_rows[1::2]):
                print(
                    f"  {ours_row['connections']:>2} conns: req/s ratio mlplane/KServe "
                    f"{ours_row['rps'] / peer_row['rps']:.2f}x, P99 ratio {ours_row['p99'] / peer_row['p99']:.2f}x"
                )
        print_rows("recommend end to end (online features, user tower, vector DB, rerank; top 10)", recommend_rows)
        print(
            f"\nload average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after "
            f"({os.cpu_count()} cores, shared by the client and the servers)"
        )
    finally:
        for process in [ours, *peers]:
            os.killpg(process.pid, 15)
            process.wait(30)


if __name__ == "__main__":
    main()
