"""Simulated annotators and reviewers for the demo, the tests and the benchmark. Each has a known
accuracy and labels through the labeling app's HTTP API, exactly as a person's browser does. The
answer key is read here, inside the simulator, and nowhere in the product."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import polars as pl

VIOLATION, OK = "violation", "ok"


def violation_answer_key(data_dir: Path) -> dict[str, str]:
    """item key (the item id as text) -> 'violation' or 'ok', from sim_truth/items."""
    files = sorted((Path(data_dir) / "sim_truth" / "items").glob("date=*/*.parquet"))
    truth = pl.concat([pl.read_parquet(f) for f in files]).unique("item_id", keep="last")
    return {str(r["item_id"]): VIOLATION if r["is_violation"] else OK for r in truth.iter_rows(named=True)}


class ApiError(RuntimeError):
    def __init__(self, response: httpx.Response):
        super().__init__(
            f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text[:300]}"
        )
        self.status_code = response.status_code


@dataclass
class SimulatedAnnotator:
    """Answers the true label with probability `accuracy`, otherwise another label at random."""

    username: str
    password: str
    accuracy: float
    seed: int = 0
    answers: dict[int, str] = field(default_factory=dict)  # item id -> label given
    round_trips: list[float] = field(default_factory=list)  # seconds from sending an answer to the next item
    # mean pause before each answer (people take seconds; the benchmark's option). Pauses are drawn
    # from an exponential distribution: equal pauses kept 20 annotators in lockstep, every answer of a
    # round arriving in the same few milliseconds
    think_seconds: float = 0.0

    def choose(self, labels: list[str], truth: str, rng: random.Random) -> str:
        if rng.random() < self.accuracy:
            return truth
        return rng.choice([label for label in labels if label != truth])

    def label_all(self, base_url: str, task: str, key: dict[str, str], limit: int | None = None) -> int:
        """Label until the task has nothing left for this annotator (or `limit` answers); returns answers."""
        rng = random.Random(f"{self.seed}:{self.username}")
        pauses = random.Random(f"{self.seed}:{self.username}:pauses")  # labels stay as without pauses
        with httpx.Client(base_url=base_url, timeout=60) as http:
            _sign_in(http, self.username, self.password)
            item = _call(http, "GET", f"/api/tasks/{task}/next")["item"]
            while item is not None and (limit is None or len(self.answers) < limit):
                label = self.choose(item["labels"], key[item["key"]], rng)
                if self.think_seconds:
                    time.sleep(pauses.expovariate(1 / self.think_seconds))
                started = time.perf_counter()
                sent = _call(
                    http, "POST", f"/api/tasks/{task}/answers", {"item_id": item["item_id"], "label": label}, retries=0
                )  # a POST is never repeated: it may have been saved
                item_next = _call(http, "GET", f"/api/tasks/{task}/next")["item"] if sent["retry"] else sent["item"]
                self.round_trips.append(time.perf_counter() - started)
                self.answers[item["item_id"]] = label
                item = item_next
        return len(self.answers)


@dataclass
class SimulatedReviewer:
    """Settles every open dispute, right with probability `accuracy`."""

    username: str
    password: str
    accuracy: float = 1.0
    seed: int = 0

    def review_all(self, base_url: str, task: str, key: dict[str, str], labels: list[str]) -> int:
        rng = random.Random(f"{self.seed}:{self.username}")
        judge = SimulatedAnnotator(self.username, self.password, self.accuracy)
        with httpx.Client(base_url=base_url, timeout=60) as http:
            _sign_in(http, self.username, self.password)
            open_disputes = _call(http, "GET", f"/api/tasks/{task}/disputes")
            for dispute in open_disputes:
                _call(
                    http,
                    "POST",
                    f"/api/tasks/{task}/verdicts",
                    {"item_id": dispute["item_id"], "label": judge.choose(labels, key[dispute["key"]], rng)},
                    retries=0,
                )
        return len(open_disputes)


def run_concurrently(jobs: list[Callable[[], int]]) -> list[int]:
    """Run the annotators' loops at once, one thread each (each is its own HTTP client, like a browser)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return [f.result() for f in [pool.submit(job) for job in jobs]]


def _sign_in(http: httpx.Client, username: str, password: str) -> None:
    token = _call(http, "POST", "/api/login", {"username": username, "password": password})["token"]
    http.headers["authorization"] = f"Bearer {token}"


def _call(http: httpx.Client, method: str, path: str, body: dict | None = None, retries: int = 5):
    """One API call; a 503 (busy or database unavailable) is retried after a short pause, as the page does."""
    for attempt in range(retries + 1):
        response = http.request(method, path, json=body)
        if response.status_code != 503 or attempt == retries:
            break
        time.sleep(0.05 * (attempt + 1))
    if response.status_code >= 400:
        raise ApiError(response)
    return response.json()
