"""Event times as producers write them (UTC offsets, no fractional seconds) are the instants the
simulator meant, in the batch path (polars, engines.data.ingest). The Flink side reads the same lines on
the cluster (test_cluster.py), where every window still equals the polars plan."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from engines.data.ingest import _cast
from tests.streaming.conftest import varied_time_lines, with_whole_seconds


def test_offsets_and_whole_seconds_parse_to_the_instants_meant():
    times = [
        datetime(2026, 1, 4, h, m, s, us, tzinfo=UTC)
        for h, m, s, us in [(0, 3, 54, 112427), (0, 59, 59, 999999), (23, 30, 0, 1), (1, 0, 0, 500000), (12, 0, 7, 250)]
        * 8
    ]
    table = with_whole_seconds(
        pa.table(
            {
                "event_id": [f"e-{k}" for k in range(len(times))],
                "event_timestamp": pa.array(times, pa.timestamp("us", "UTC")),
            }
        )
    )
    lines = varied_time_lines(table)
    written = [json.loads(line)["event_timestamp"] for line in lines]
    assert all(
        any(test(t) for t in written)
        for test in (
            lambda t: t.endswith("+02:00"),
            lambda t: t.endswith("-05:30"),
            lambda t: "." not in t and t.endswith("Z"),
            lambda t: "." not in t and t.endswith("+02:00"),
        )
    )
    parsed = _cast(pl.read_ndjson("\n".join(lines).encode())["event_timestamp"], "timestamp")
    assert parsed.to_list() == table["event_timestamp"].to_pylist()
