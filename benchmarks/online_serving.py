"""Online serving: mlplane's model server against KServe's own Python model server and NVIDIA Triton
(2.51, CPU, Python backend: the server of the nvidia-pytriton wheel in .venv-triton, scripts/setup-triton),
same model, same machine, same run. OIP v2 JSON infer of the personalization user tower at 1 and 32
connections (every server; Triton runs the model's Triton export, engines/models/model_export.py, and takes the
encoded tensors its config.pbtxt declares, which the other two encode themselves from feature columns), and
`recommend` end to end (online features, user tower, vector DB, rerank; ours only: the others have no such
path). Each row is run `--repeats` times, the servers taking turns; prints the median over repeats of P50,
P99, requests/s and server CPU per request (the server's whole process tree), and the ratios.

  .venv/bin/python benchmarks/online_serving.py [--data-dir DIR] [--requests 400] [--repeats 3] [--device cpu|cuda]

Without --data-dir it simulates 3 days and runs the daily pipeline (benchmarks/online_features.py's
lake). The model is the two-tower built from that lake's training set with random weights (speed does
not depend on training). The KServe peer runs from `.venv-kserve` (scripts: see README) when present.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
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

    from engines.models.registry import ModelRegistry
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
    """User + system CPU of a process and its live descendants (Triton's Python-backend stubs, a server's
    workers), and of the children they waited for."""
    total = 0.0
    root = psutil.Process(pid)
    for process in (root, *root.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


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


def triton_body(model_dir: Path) -> dict:
    """The infer body's user as the Triton export takes it: the tensors `TowerSpec.encode` makes."""
    import polars as pl

    from ml.personalization import ModelSpec

    spec = ModelSpec.from_json((model_dir / "model.json").read_text()).user
    row = {spec.id_column: [7], **{c: [1.0] for c in spec.numeric}, **{c: ["eu"] for c in spec.categorical}}
    row |= {c: [[1, 2, 3]] for c in spec.histories}
    encoded = {k: v.numpy() for k, v in spec.encode(pl.DataFrame(row)).items() if v.numel()}
    encoded["ids"] = encoded["ids"].reshape(-1, 1)  # dims [1], a scalar per row once Triton reshapes it
    datatypes = {"float32": "FP32", "int64": "INT64"}
    return {
        "inputs": [
            {"name": k, "datatype": datatypes[str(v.dtype)], "shape": list(v.shape), "data": v.ravel().tolist()}
            for k, v in encoded.items()
        ]
    }


def start_triton(data_dir: Path, model_dir: Path, stack: contextlib.ExitStack) -> tuple[int, int] | None:
    """Triton over the champion's export (pid, HTTP port); None where .venv-triton is absent."""
    from engines.models.model_export import ExportTarget, export_target
    from engines.models.registry import CHECKSUM_TAG, ModelRegistry
    from engines.models.triton_server import TRITON_VENV, running_triton, server_folder

    try:
        server_folder()
    except FileNotFoundError as missing:
        print(f"Triton peer skipped: {missing}")
        return None
    version = ModelRegistry.local(data_dir / "bench_registry").by_alias("personalization", "champion")
    target = ExportTarget(
        "personalization",
        "personalization",
        "two_tower",
        version.version,
        "alias 'champion'",
        version.tags[CHECKSUM_TAG],
    )
    repository = Path(tempfile.mkdtemp(prefix="triton-", dir=data_dir))
    export_target(target, model_dir, repository)
    log = repository / "triton.log"
    server = stack.enter_context(running_triton(repository, log, {"OMP_NUM_THREADS": "1"}, venv=TRITON_VENV))
    return server.process.pid, server.http_port


def summary(runs: list[dict]) -> dict:
    """The median over repeats of each figure of one server and connection count."""
    return {
        **runs[0],
        **{k: statistics.median(r[k] for r in runs) for k in ("p50", "p99", "rps", "cpu_ms")},
        "repeats": len(runs),
    }


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'server':<28}{'conns':>6}{'P50 ms':>9}{'P99 ms':>9}{'req/s':>9}{'CPU ms/req':>12}")
    for r in rows:
        print(
            f"{r['server']:<28}{r['connections']:>6}{r['p50']:>9.2f}{r['p99']:>9.2f}{r['rps']:>9.0f}"
            f"{r['cpu_ms']:>12.2f}"
        )


def start_ours(data_dir: Path, device: str, env: dict) -> tuple[subprocess.Popen, int]:
    config = {
        "registry_root": str(data_dir / "bench_registry"),
        "lake_root": str(data_dir),
        "device": device,
        "feature_log_sample": 0.0,
        "vector_store": str(data_dir / "bench_vectors"),
        "models": [{"name": "personalization", "registry_model": "personalization", "kind": "two_tower"}],
    }
    config_path = data_dir / "bench_server.yaml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    command = [sys.executable, "-m", "serving.models", "--config", str(config_path), "--port", str(port)]
    command += ["--grpc-port", "0", "--log-level", "warning"]
    return start(command, f"http://127.0.0.1:{port}/v2/health/ready", env), port


def start_kserve(model_dir: Path, env: dict) -> tuple[subprocess.Popen, int] | None:
    if not kserve_installed():
        print(f"KServe peer skipped: no kserve in {KSERVE_PYTHON} (see README: Online model server)")
        return None
    port = free_port()
    command = [str(KSERVE_PYTHON), "benchmarks/kserve_towers.py", "--model_dir", str(model_dir)]
    command += ["--http_port", str(port), "--grpc_port", str(free_port())]
    return start(command, f"http://127.0.0.1:{port}/v2/health/ready", env), port


def run_rows(targets: list[tuple], requests: int, repeats: int) -> list[dict]:
    """Every target at 1 and 32 connections, `repeats` times, the targets taking turns; medians."""
    runs: dict[tuple, list[dict]] = {}
    for _ in range(repeats):
        for connections in (1, 32):
            for name, url, body, pid in targets:
                runs.setdefault((name, connections), []).append(measure(name, url, body, pid, requests, connections))
    return [summary(rows) for rows in runs.values()]


def print_ratios(rows: list[dict], ours: str, peer: str) -> None:
    by = {(r["server"], r["connections"]): r for r in rows}
    for connections in (1, 32):
        if (peer, connections) in by:
            a, b = by[(ours, connections)], by[(peer, connections)]
            print(
                f"  {connections:>2} conns: req/s {a['rps']:.0f} mlplane, {b['rps']:.0f} {peer}; ratio "
                f"{a['rps'] / b['rps']:.2f}x, P99 ratio {a['p99'] / b['p99']:.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="mlplane-serving-bench-"))
    if not (data_dir / "feature_repo" / "online_store.db").exists():
        build_lake(data_dir)
    model_dir = register_model(data_dir)
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with contextlib.ExitStack() as stack:
        ours, ours_port = start_ours(data_dir, args.device, env)
        stack.callback(stop, ours)
        body = infer_body(model_dir)
        infer = [
            ("mlplane serving/models", f"http://127.0.0.1:{ours_port}/v2/models/personalization/infer", body, ours.pid)
        ]
        kserve = start_kserve(model_dir, env)
        if kserve:
            stack.callback(stop, kserve[0])
            url = f"http://127.0.0.1:{kserve[1]}/v2/models/personalization/infer"
            infer.append(("KServe ModelServer", url, body, kserve[0].pid))
        triton = start_triton(data_dir, model_dir, stack)
        if triton:
            url = f"http://127.0.0.1:{triton[1]}/v2/models/personalization-user_tower/infer"
            infer.append(("Triton 2.51 Python backend", url, triton_body(model_dir), triton[0]))
        infer_rows = run_rows(infer, args.requests, args.repeats)
        recommend = [
            ("mlplane recommend", f"http://127.0.0.1:{ours_port}/recommend", {"user_id": 7, "k": 10}, ours.pid)
        ]
        recommend_rows = run_rows(recommend, args.requests, args.repeats)
        title = f"OIP v2 JSON infer, personalization user tower, {args.requests} requests, median of {args.repeats}"
        print_rows(title, infer_rows)
        for peer, *_ in infer[1:]:
            print_ratios(infer_rows, infer[0][0], peer)
        print_rows("recommend end to end (online features, user tower, vector DB, rerank; top 10)", recommend_rows)
        print(
            f"\nload average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after "
            f"({os.cpu_count()} cores, shared by the client and the servers)"
        )


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, 15)
    process.wait(30)


if __name__ == "__main__":
    main()
