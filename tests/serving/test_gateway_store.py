"""The gateway's usage records in SQLite and in the real PostgreSQL: the same random records written
in batches come back as the same report, which equals a recount from the records themselves; and the
usage writer loses none across a long store outage and a stop in the middle of it."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import defaultdict

import pytest

from serving.gateway import usage
from serving.gateway.store import GatewayStore
from tests.services import create_database, drop_database


def random_records(rng: random.Random, n: int) -> list[dict]:
    return [
        {
            "request_id": f"req-{uuid.UUID(int=rng.getrandbits(128)).hex}",
            "ts": 1_700_000_000 + rng.random() * 86_400,
            "key_id": rng.choice(["k1", "k2", "k3"]),
            "team": rng.choice(["search", "ads"]),
            "model": rng.choice(["gateway-llm", "recs"]),
            "backend": rng.choice([None, "http://10.0.0.1:8000", "http://10.0.0.2:8000"]),
            "region": rng.choice([None, "eu", "us"]),
            "endpoint": rng.choice(["chat", "completions", "v2"]),
            "prompt_tokens": rng.randrange(0, 4000),
            "completion_tokens": rng.randrange(0, 500),
            "latency_ms": rng.random() * 900,
            "status": rng.choice([200, 200, 200, 429, 499, 502]),
        }
        for _ in range(n)
    ]


def recount(records: list[dict], since: float, until: float) -> dict:
    totals = defaultdict(lambda: [0, 0, 0, 0])
    for r in records:
        if since <= r["ts"] < until:
            total = totals[(r["key_id"], r["model"], r["status"])]
            total[0] += 1
            total[1] += r["prompt_tokens"]
            total[2] += r["completion_tokens"]
            total[3] += r["status"] >= 400
    return {key: tuple(value) for key, value in totals.items()}


def reported(store: GatewayStore, since: float, until: float) -> dict:
    rows = store.usage_report(since, until, ("key_id", "model", "status"))
    return {
        (r["key_id"], r["model"], r["status"]): (r["requests"], r["prompt_tokens"], r["completion_tokens"], r["errors"])
        for r in rows
    }


@pytest.mark.services  # PostgreSQL
def test_usage_records_in_sqlite_and_postgresql_report_what_was_written(tmp_path):
    rng = random.Random(11)
    records = random_records(rng, 700)
    database = f"mlplane_test_usage_{uuid.uuid4().hex[:8]}"
    stores = [GatewayStore(f"sqlite:///{tmp_path}/usage.db"), GatewayStore(create_database(database))]
    try:
        for store in stores:
            for start in range(0, len(records), 250):  # the writer's batches, the last one short
                store.write_usage(records[start : start + 250])
        for _ in range(5):
            since = 1_700_000_000 + rng.random() * 60_000
            until = since + rng.random() * 40_000
            expected = recount(records, since, until)
            assert expected and all(reported(store, since, until) == expected for store in stores)
        with stores[1].engine.connect() as conn:
            latency = conn.exec_driver_sql("SELECT sum(latency_ms) FROM gateway_usage").scalar()
        assert latency == pytest.approx(sum(r["latency_ms"] for r in records))
    finally:
        for store in stores:
            store.engine.dispose()
        drop_database(database)


OUTAGE_START_S, OUTAGE_S = 10.0, 60.0  # the store refuses every write for a minute


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class StoreWithOutage:
    """The real SQLite store behind a fault injector (the outage stands for a database the platform does
    not run: a network cut or a failover): every write in the outage window raises."""

    def __init__(self, store: GatewayStore, clock: Clock):
        self.store, self.clock, self.refused_at = store, clock, []

    def write_usage(self, records, **options):
        if OUTAGE_START_S <= self.clock() < OUTAGE_START_S + OUTAGE_S:
            self.refused_at.append(self.clock())
            raise ConnectionError("store unreachable")
        self.store.write_usage(records, **options)


async def send(writer: usage.UsageWriter, clock: Clock, records: list[dict], until_s: float) -> None:
    """Records at a steady rate of the writer's clock, the loop turning between them."""
    step = 0.1
    while clock.now < until_s and records:
        clock.now += step
        writer.record(records.pop())
        await asyncio.sleep(0.002)


def test_no_usage_record_is_lost_across_a_minute_of_store_outage_and_a_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(usage, "LINGER_S", 0.0)
    records = random_records(random.Random(5), 1200)
    store = GatewayStore(f"sqlite:///{tmp_path}/usage.db")
    clock = Clock()
    outage = StoreWithOutage(store, clock)
    spill = tmp_path / "spill"

    async def before_and_during_the_outage():
        writer = usage.UsageWriter(outage, spill, clock=clock)
        writer.start()
        pending = list(records)
        await send(writer, clock, pending, OUTAGE_START_S + OUTAGE_S - 0.5)  # the stop comes inside the outage
        await writer.close()  # what SIGTERM runs (Gateway.stop): the queue is written or spilled
        return pending

    async def after_a_restart(pending: list[dict]):
        clock.now = OUTAGE_START_S + OUTAGE_S  # the store is back
        writer = usage.UsageWriter(outage, spill, clock=clock)
        writer.start()  # replays the spill first
        await send(writer, clock, pending, float("inf"))
        await writer.close()

    try:
        pending = asyncio.run(before_and_during_the_outage())
        # the outage lasted its full minute and the writer met it at both ends
        assert outage.refused_at and min(outage.refused_at) < OUTAGE_START_S + 1
        assert max(outage.refused_at) > OUTAGE_START_S + OUTAGE_S - usage.RETRY_S[-1] - 1
        assert list(spill.glob("*.jsonl")) and len(pending) > 0
        asyncio.run(after_a_restart(pending))
        assert not list(spill.iterdir())  # every spilled file replayed and removed
        with store.engine.connect() as conn:
            ids = [row[0] for row in conn.exec_driver_sql("SELECT request_id FROM gateway_usage")]
        assert len(ids) == len(records) and set(ids) == {r["request_id"] for r in records}  # each once
        assert reported(store, 0, 2e9) == recount(records, 0, 2e9)
    finally:
        store.engine.dispose()


def test_a_replay_skips_records_the_store_already_holds(tmp_path):
    records = random_records(random.Random(6), 20)
    store = GatewayStore(f"sqlite:///{tmp_path}/usage.db")
    try:
        store.write_usage(records[:8])  # landed, but the writer never heard back
        store.write_usage(records, skip_existing=True)
        assert reported(store, 0, 2e9) == recount(records, 0, 2e9)
    finally:
        store.engine.dispose()
