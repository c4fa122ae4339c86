"""The ML gateway's added latency and maximum throughput, side by side with LiteLLM's proxy.

Both proxies stand in front of the same fast local upstream (a minimal OpenAI-compatible stub that
answers a fixed chat completion at once: it stands for a model server, outside the gateway) and are
driven by the same load generator in the same run:

- added latency: sequential requests (one in flight); P50 and P99 of the proxy's time minus the
  upstream's own time measured directly, per round; medians over rounds.
- maximum requests/s: CONCURRENCY requests in flight until REQUESTS have completed, per round.
- server CPU per request: the proxy's processes' CPU time (user + system, psutil) over each phase
  divided by its requests, at one connection and at CONCURRENCY.

The mlplane gateway checks an API key from its SQLite store (cached), a token-count rate limit
(in-process) and writes usage records; LiteLLM runs without a database (its master key only, no spend
tracking: its lightest setup). LiteLLM installs into
its own throwaway environment `.venv-litellm` (its pins clash with the main one).

    .venv/bin/python benchmarks/gateway.py [--rounds 5] [--requests 300] [--throughput-requests 800] [--concurrency 8]
        [--workers 1] [--redis-limits] [--skip-litellm]

With --workers N the gateway runs N processes sharing its limits through Redis (MLPLANE_BENCH_REDIS,
default redis://127.0.0.1:6379/0, under a throwaway key prefix); --redis-limits puts one worker's limits
there too, so that the CPU per request of 1 and N workers compares like with like.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LITELLM_VENV = ROOT / ".venv-litellm"
LITELLM_MASTER_KEY = "sk-" + "5f" * 32  # LiteLLM refuses to start without one; checked per request
COMPLETION = {
    "id": "chatcmpl-stub",
    "object": "chat.completion",
    "created": 0,
    "model": "stub",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "A red low-poly chair."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
}
REQUEST = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Describe item 42 in five words."}],
    "max_tokens": 16,
}


async def stub_app(scope, receive, send):
    """A raw ASGI OpenAI-compatible upstream: chat completions, /health and /v1/models."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    path = scope["path"]
    if path.endswith("/models"):
        body = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode()
    else:
        body = STUB_BODY if path.endswith("/chat/completions") else b'{"status":"ok"}'
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


STUB_BODY = json.dumps(COMPLETION).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 180) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready after {timeout} s")


def setup_litellm() -> Path:
    """`.venv-litellm` with LiteLLM's proxy; idempotent."""
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        print("installing litellm[proxy] into .venv-litellm ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "--quiet", "litellm[proxy]"], check=True)
    return binary


async def drive(url: str, headers: dict, requests: int, concurrency: int) -> tuple[list[float], float]:
    """Latencies of `requests` chat completions with `concurrency` in flight, and the elapsed time."""
    import httpx

    latencies: list[float] = []
    failures = 0
    remaining = requests
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:

        async def worker():
            nonlocal remaining, failures
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=REQUEST)
                if response.status_code != 200:
                    failures += 1
                    continue
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{url}: {failures} of {requests} requests failed")
    return latencies, elapsed


def cpu_seconds(process: subprocess.Popen) -> float:
    """CPU time of a server and its worker processes so far."""
    import psutil

    total = 0.0
    root = psutil.Process(process.pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def measured(process: subprocess.Popen, url: str, headers: dict, requests: int, concurrency: int):
    """(latencies, elapsed, server CPU seconds per request) of one phase."""
    before = cpu_seconds(process)
    latencies, elapsed = asyncio.run(drive(url, headers, requests, concurrency))
    return latencies, elapsed, (cpu_seconds(process) - before) / requests


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start(command: list[str], env: dict | None = None, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "w") if log else subprocess.DEVNULL  # the child keeps it open
    return subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=ROOT,
    )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300, help="Sequential requests per round (latency).")
    parser.add_argument("--throughput-requests", type=int, default=800)
    parser.add_argument(
        "--concurrency", type=int, default=8, help="In flight at once (httpx slows down past about 8 on two cores)."
    )
    parser.add_argument("--workers", type=int, default=1, help="Gateway processes (limits shared in Redis).")
    parser.add_argument(
        "--redis-limits", action="store_true", help="Limits in Redis with one worker too (to compare with --workers)."
    )
    parser.add_argument("--skip-litellm", action="store_true", help="Measure the mlplane gateway only.")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from serving.gateway.store import GatewayStore

    litellm = None if args.skip_litellm else setup_litellm()
    work = Path(tempfile.mkdtemp(prefix="mlplane-gateway-bench-"))
    upstream_port, gateway_port, litellm_port = free_port(), free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    store_url = f"sqlite:///{work}/gateway.db"
    redis_url = os.environ.get("MLPLANE_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    rate_limits = redis_url if args.workers > 1 or args.redis_limits else "memory"
    (work / "gateway.yaml").write_text(
        json.dumps(
            {
                "model_list": [
                    {"model_name": "bench", "url": upstream_url, "model": "stub", "region": "local", "capacity": 1000}
                ],
                "settings": {
                    "store": store_url,
                    "rate_limits": rate_limits,
                    "rate_limit_prefix": f"mlplane:bench:{os.getpid()}",
                    "key_cache_s": 30.0,
                },
            }
        )
    )
    secret, _ = GatewayStore(store_url).create_key("bench", "bench", ["bench"], tpm=10**9, rpm=10**9)
    (work / "litellm.yaml").write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": "bench",
                        "litellm_params": {
                            "model": "openai/stub",
                            "api_base": f"{upstream_url}/v1",
                            "api_key": "unused",
                        },
                    }
                ],
                "litellm_settings": {"drop_params": True, "set_verbose": False},
                "general_settings": {"master_key": LITELLM_MASTER_KEY},
            }
        )
    )
    python = sys.executable
    processes = [
        start(
            [
                python,
                "-m",
                "uvicorn",
                "benchmarks.gateway:stub_app",
                "--port",
                str(upstream_port),
                "--log-level",
                "warning",
                "--no-access-log",
            ]
        ),
        start(
            [
                python,
                "-m",
                "serving.gateway",
                "--config",
                str(work / "gateway.yaml"),
                "--port",
                str(gateway_port),
                "--log-level",
                "warning",
                "--workers",
                str(args.workers),
            ],
            log=work / "gateway.log",
        ),
    ]
    if litellm:
        processes.append(
            start(
                [
                    str(litellm),
                    "--config",
                    str(work / "litellm.yaml"),
                    "--port",
                    str(litellm_port),
                    "--num_workers",
                    "1",
                ],
                env={"LITELLM_LOG": "ERROR"},
                log=work / "litellm.log",
            )
        )
    try:
        wait_ready(f"{upstream_url}/health", processes[0])
        wait_ready(f"http://127.0.0.1:{gateway_port}/health", processes[1])
        targets = {
            "upstream (direct)": (processes[0], upstream_url, {}),
            "mlplane gateway": (
                processes[1],
                f"http://127.0.0.1:{gateway_port}",
                {"Authorization": f"Bearer {secret}"},
            ),
        }
        if litellm:
            wait_ready(f"http://127.0.0.1:{litellm_port}/health/liveliness", processes[2])
            targets["litellm proxy"] = (
                processes[2],
                f"http://127.0.0.1:{litellm_port}",
                {"Authorization": f"Bearer {LITELLM_MASTER_KEY}"},
            )
        for _process, url, headers in targets.values():  # warm connections, caches and imports
            asyncio.run(drive(url, headers, 50, 4))
        results = {name: {"p50": [], "p99": [], "rps": [], "cpu1": [], "cpuN": []} for name in targets}
        for round_ in range(args.rounds):
            for name, (process, url, headers) in targets.items():
                latencies, _, cpu1 = measured(process, url, headers, args.requests, 1)
                _, elapsed, cpu_n = measured(process, url, headers, args.throughput_requests, args.concurrency)
                results[name]["p50"].append(percentile(latencies, 0.5))
                results[name]["p99"].append(percentile(latencies, 0.99))
                results[name]["rps"].append(args.throughput_requests / elapsed)
                results[name]["cpu1"].append(cpu1)
                results[name]["cpuN"].append(cpu_n)
            print(f"round {round_ + 1}/{args.rounds} done", flush=True)
        report(results, args)
    finally:
        for process in processes:
            stop(process)
        if rate_limits != "memory":  # the throwaway counters of this run
            import redis

            client = redis.Redis.from_url(rate_limits)
            for key in client.scan_iter(f"mlplane:bench:{os.getpid()}:*"):
                client.delete(key)


def report(results: dict, args) -> None:
    direct = results["upstream (direct)"]
    print(
        f"\nchat completions through each proxy to the same stub upstream; {args.rounds} rounds, "
        f"{args.requests} sequential requests (latency) and {args.throughput_requests} requests at "
        f"concurrency {args.concurrency} (throughput) per round; medians over rounds"
    )
    print(
        f"{'':<20}{'P50 ms':>9}{'P99 ms':>9}{'added P50':>11}{'added P99':>11}{'max req/s':>11}"
        f"{'CPU ms/req @1':>15}{f'CPU ms/req @{args.concurrency}':>16}"
    )
    rows = {}
    for name, values in results.items():
        added50 = [a - b for a, b in zip(values["p50"], direct["p50"])]
        added99 = [a - b for a, b in zip(values["p99"], direct["p99"])]
        rows[name] = (
            statistics.median(values["p50"]) * 1e3,
            statistics.median(values["p99"]) * 1e3,
            statistics.median(added50) * 1e3,
            statistics.median(added99) * 1e3,
            statistics.median(values["rps"]),
            statistics.median(values["cpu1"]) * 1e3,
            statistics.median(values["cpuN"]) * 1e3,
        )
        p50, p99, a50, a99, rps, cpu1, cpu_n = rows[name]
        print(f"{name:<20}{p50:>9.2f}{p99:>9.2f}{a50:>11.2f}{a99:>11.2f}{rps:>11.0f}{cpu1:>15.2f}{cpu_n:>16.2f}")
    if "litellm proxy" not in rows:
        print("\nLiteLLM not measured (--skip-litellm): no ratio")
        return
    ours, theirs = rows["mlplane gateway"], rows["litellm proxy"]
    print(
        f"\nratio litellm / mlplane: added P50 {theirs[2] / ours[2]:.2f}x, added P99 {theirs[3] / ours[3]:.2f}x, "
        f"max req/s mlplane / litellm {ours[4] / theirs[4]:.2f}x, CPU per request {theirs[5] / ours[5]:.2f}x "
        f"(1 conn), {theirs[6] / ours[6]:.2f}x ({args.concurrency} conns)"
    )


if __name__ == "__main__":
    main()
