"""A gateway process stopped by SIGTERM under load: it stops accepting at once, finishes every request
it admitted (answers and streams in flight end whole), writes a usage record for each before it exits,
and, past settings.drain_timeout_s, ends what is still running with a record each (status 499) rather
than losing them. Records are counted in the store after the process has exited.

The backends are the fake of vLLM in fake_vllm.py (outside the platform), which holds its answers
until the test lets them go: the requests are in flight at the gateway when the signal arrives."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from serving.gateway.store import GatewayStore
from tests.serving.conftest import EMBEDDING_MODEL, MODEL_NAME, GatewayProcess
from tests.serving.gateway.fake_vllm import FakeVllm, gateway_over

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
PLAIN, STREAMED, EMBEDDED = 6, 4, 2  # requests in flight when the signal comes


class Load:
    """Requests sent from threads; each keeps its status and what it received."""

    def __init__(self, gateway: GatewayProcess, key: str):
        self.url, self.headers = gateway.url, {"Authorization": f"Bearer {key}"}
        self.results: list[tuple[str, int | str, str]] = []
        self.threads = [threading.Thread(target=self.plain, args=("/v1/chat/completions", CHAT)) for _ in range(PLAIN)]
        self.threads += [threading.Thread(target=self.stream) for _ in range(STREAMED)]
        embed = {"model": EMBEDDING_MODEL, "input": "hi"}
        self.threads += [threading.Thread(target=self.plain, args=("/v1/embeddings", embed)) for _ in range(EMBEDDED)]
        for thread in self.threads:
            thread.start()

    def plain(self, path: str, body: dict) -> None:
        try:
            answer = httpx.post(self.url + path, json=body, headers=self.headers, timeout=120)
            self.results.append(("plain", answer.status_code, answer.text))
        except httpx.HTTPError as error:
            self.results.append(("plain", type(error).__name__, ""))

    def stream(self) -> None:
        try:
            body = {**CHAT, "stream": True}
            with httpx.stream(
                "POST", self.url + "/v1/chat/completions", json=body, headers=self.headers, timeout=120
            ) as s:
                text = "".join(s.iter_text())
            self.results.append(("stream", s.status_code, text))
        except httpx.HTTPError as error:
            self.results.append(("stream", type(error).__name__, ""))

    def join(self) -> None:
        for thread in self.threads:
            thread.join(120)


def in_flight(fake: FakeVllm, count: int) -> None:
    deadline = time.time() + 60
    while fake.requests < count and time.time() < deadline:
        time.sleep(0.05)
    assert fake.requests == count


def refuses_connections(url: str) -> bool:
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            httpx.get(url + "/health", timeout=2)
        except httpx.ConnectError:
            return True
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return False


def recorded(store_url: str, spill: Path, key: str) -> Counter:
    """Usage records of `key` by status: the store's, and any spilled to disk for the next start."""
    key_id = key.split("-")[2]
    store = GatewayStore(store_url)
    try:
        rows = store.usage_report(group_by=("key_id", "status"))
    finally:
        store.close()
    counts = Counter({row["status"]: row["requests"] for row in rows if row["key_id"] == key_id})
    for path in spill.glob("*.jsonl"):
        counts["spilled"] += sum(1 for line in path.read_text().splitlines() if key_id in line)
    return counts


def sigterm(gateway: GatewayProcess) -> None:
    os.kill(gateway.process.pid, signal.SIGTERM)


def stopped(gateway: GatewayProcess) -> bool:
    """The process ended; uvicorn raises the signal again once its shutdown is done, so a clean stop
    ends as killed by SIGTERM (what was lost or kept is what the tests count)."""
    return gateway.process.wait(60) in (0, -signal.SIGTERM)


@pytest.fixture
def held(tmp_path):
    """A fake backend that holds every answer, and a gateway over it."""
    fake = FakeVllm()
    fake.hold = threading.Event()
    gateway = gateway_over(fake, tmp_path, drain_timeout_s=60)
    yield fake, gateway
    fake.hold.set()
    gateway.stop()
    fake.close()


@pytest.mark.services  # a gateway process
def test_sigterm_finishes_every_admitted_request_and_records_it(held, tmp_path):
    fake, gateway = held
    key = gateway.key()
    load = Load(gateway, key)
    in_flight(fake, PLAIN + STREAMED + EMBEDDED)
    sigterm(gateway)
    assert refuses_connections(gateway.url)  # nothing new is admitted while it drains
    fake.hold.set()
    load.join()
    assert stopped(gateway)
    kinds = Counter((kind, status) for kind, status, _ in load.results)
    assert kinds == {("plain", 200): PLAIN + EMBEDDED, ("stream", 200): STREAMED}, load.results
    for kind, _, text in load.results:
        assert text.rstrip().endswith("data: [DONE]") if kind == "stream" else '"usage"' in text
    store = gateway.config["settings"]["store"]
    assert recorded(store, tmp_path / "usage_spill", key) == {200: PLAIN + STREAMED + EMBEDDED}


@pytest.mark.services  # a gateway process
def test_requests_still_running_at_the_drain_limit_are_ended_and_recorded(tmp_path):
    fake = FakeVllm()
    fake.hold = threading.Event()  # never set: these answers never come
    gateway = gateway_over(fake, tmp_path, drain_timeout_s=1)
    try:
        key = gateway.key()
        load = Load(gateway, key)
        in_flight(fake, PLAIN + STREAMED + EMBEDDED)
        sigterm(gateway)
        assert stopped(gateway)
        load.join()
        assert all(status != 200 for _, status, _ in load.results), load.results
        store = gateway.config["settings"]["store"]
        counts = recorded(store, tmp_path / "usage_spill", key)
        assert sum(counts.values()) == PLAIN + STREAMED + EMBEDDED, counts
    finally:
        fake.hold.set()
        gateway.stop()
        fake.close()
