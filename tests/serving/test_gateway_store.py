"""The gateway's usage records in SQLite and in the real PostgreSQL: the same random records written
in batches come back as the same report, which equals a recount from the records themselves."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict

import pytest

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
