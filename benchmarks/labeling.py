"""Answer-to-next-item round trip of the labeling app under concurrent simulated annotators.

Each simulated annotator is its own HTTP client (like a browser) and loops: POST an answer, which
returns the next item. The round trip is timed from sending the answer to having the next item.
The app runs in uvicorn in a process of its own (as `mlplane labeling serve` does; `--in-process` puts
it in the clients' process, where their 20 threads compete with it for the interpreter lock) on SQLite
by default or on a PostgreSQL URL. With no think time (the default) every annotator answers the moment
an item arrives, so the server is never idle and a round trip is mostly the wait behind the other
annotators' requests; `--think-ms` adds pauses before the answers, as people take (exponential, that mean).
`--sign-in-flood N` runs N threads of wrong sign-ins (unknown users, so each costs a full password
hash) for the whole run, with the per-address limit lifted so none is refused cheaply: the worst case,
a flood from many addresses. `--label-studio URL` runs the same loop against a running Label Studio
(benchmarks/label_studio.py says how to start one in its own environment) in the same run, and prints
both figures and the ratio.

    .venv/bin/python benchmarks/labeling.py --annotators 20 --items 500
    .venv/bin/python benchmarks/labeling.py --annotators 20 --items 500 --sign-in-flood 20
    .venv/bin/python benchmarks/labeling.py --think-ms 1000 --items 100 --label-studio http://127.0.0.1:8090
    .venv/bin/python benchmarks/labeling.py --database postgresql+psycopg2://postgres@127.0.0.1:5432/bench
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import label_studio  # noqa: E402
from ground_truth import accounts, queue  # noqa: E402
from ground_truth.db import connect  # noqa: E402
from ground_truth.schema import ItemIn, Role, TaskSpec  # noqa: E402
from ground_truth.server import serve_app  # noqa: E402
from ground_truth.throttle import SignInThrottle  # noqa: E402
from simulator.annotators import SimulatedAnnotator, run_concurrently  # noqa: E402

PASSWORD = "benchmark-pass"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def prepare(url: str, annotators: int, items: int, k: int) -> dict[str, str]:
    engine = connect(url)
    for i in range(annotators):
        accounts.create_account(engine, f"bench{i}", PASSWORD, Role.annotator)
    task = queue.create_task(
        engine,
        TaskSpec(name="bench", question="Copy?", labels=["violation", "ok"], annotators_per_item=k, gold_share=0.1),
    )
    queue.add_items(
        engine,
        task,
        [
            ItemIn(key=str(i), queue="audit", title=f"item {i}", gold_label="ok" if i % 50 == 0 else None)
            for i in range(items)
        ],
    )
    engine.dispose()
    return {str(i): "violation" if i % 7 == 0 else "ok" for i in range(items)}


@contextmanager
def sign_in_flood(base_url: str, threads: int) -> Iterator[list[int]]:
    """`threads` loops of wrong sign-ins until the block ends; yields the status codes answered."""
    codes: list[int] = []
    stop = threading.Event()

    def guess(n: int) -> None:
        with httpx.Client(base_url=base_url, timeout=120) as http:
            attempt = 0
            while not stop.is_set():
                attempt += 1
                body = {"username": f"flood{n}-{attempt}", "password": "wrong guess"}
                codes.append(http.post("/api/login", json=body).status_code)

    workers = [threading.Thread(target=guess, args=(n,), daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield codes
    finally:
        stop.set()
        for worker in workers:
            worker.join(120)


@contextmanager
def app_process(url: str, address_limit: int = 100) -> Iterator[str]:
    """The app in a uvicorn process of its own on a free port; yields its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = (
        "import uvicorn; from ground_truth.app import create_app; "
        "from ground_truth.throttle import SignInThrottle; "
        f"app = create_app({url!r}, throttle=SignInThrottle(per_address={address_limit})); "
        f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning', access_log=False)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base_url}/login", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the labeling app did not start")
            time.sleep(0.1)
        yield base_url
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("-k", type=int, default=3, help="annotators per item")
    parser.add_argument("--database", default=None, help="SQLAlchemy URL of an EMPTY database (default: SQLite)")
    parser.add_argument(
        "--think-ms", type=float, default=0.0, help="mean of each annotator's pauses before an answer (exponential)"
    )
    parser.add_argument("--label-studio", metavar="URL", help="also run the loop against this Label Studio")
    parser.add_argument("--label-studio-admin", default="admin@example.com:benchmark-pass", help="EMAIL:PASSWORD")
    parser.add_argument("--in-process", action="store_true", help="run the app in this process (as before)")
    parser.add_argument(
        "--sign-in-flood", type=int, default=0, metavar="N", help="N threads of wrong sign-ins throughout the run"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="labeling-bench-") as work:
        url = args.database or f"sqlite:///{Path(work) / 'labels.db'}"
        truth = prepare(url, args.annotators, args.items, args.k)
        people = [
            SimulatedAnnotator(f"bench{i}", PASSWORD, 0.9, seed=i, think_seconds=args.think_ms / 1000)
            for i in range(args.annotators)
        ]
        limit = 10**9 if args.sign_in_flood else 100  # a flood's every attempt costs a hash: none refused
        in_process = serve_app(url, throttle=SignInThrottle(per_address=limit))
        with in_process if args.in_process else app_process(url, limit) as base_url:
            with sign_in_flood(base_url, args.sign_in_flood) as flood:
                started = time.perf_counter()
                answers = sum(run_concurrently([lambda p=p: p.label_all(base_url, "bench", truth) for p in people]))
                seconds = time.perf_counter() - started
    trips = [t * 1000 for p in people for t in p.round_trips]
    backend = url.split(":")[0]
    where = "in the clients' process" if args.in_process else "own process"
    print(
        f"labeling app ({backend}, {where}), {args.annotators} concurrent annotators, think time "
        f"{args.think_ms:g} ms, {args.items} items, k={args.k}: "
        f"{answers} answers in {seconds:.1f} s ({answers / seconds:.0f} answers/s)"
    )
    if args.sign_in_flood:
        refused = sum(code != 401 for code in flood)
        print(
            f"during a sign-in flood of {args.sign_in_flood} threads: {len(flood)} wrong sign-ins answered "
            f"({len(flood) / seconds:.0f}/s), {refused} not 401"
        )
    report("answer-to-next-item round trip", trips)
    if args.label_studio:
        answers, seconds, peer = label_studio.run(
            args.label_studio, args.label_studio_admin, args.annotators, args.items, args.k, args.think_ms / 1000
        )
        peer = [t * 1000 for t in peer]
        print(f"Label Studio, the same loop: {answers} answers in {seconds:.1f} s ({answers / seconds:.0f} answers/s)")
        report("Label Studio round trip", peer)
        print(
            f"ratio (Label Studio / ours): median {statistics.median(peer) / statistics.median(trips):.1f}x, "
            f"P99 {percentile(peer, 0.99) / percentile(trips, 0.99):.1f}x"
        )


def report(what: str, trips: list[float]) -> None:
    median, p99 = statistics.median(trips), percentile(trips, 0.99)
    print(f"{what}: median {median:.1f} ms, P99 {p99:.1f} ms, max {max(trips):.1f} ms")


if __name__ == "__main__":
    main()
