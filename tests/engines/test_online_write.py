"""OnlineWriter writes into Feast's SQLite online store exactly the rows Feast's own write does."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pandas as pd
import pytest
from feast import ValueType

from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings
from engines.features.online_write import OnlineWriter
from feature_defs import catalogue


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("online-write")
    engine = FeatureStoreEngine(FeatureStoreSettings(repo_dir=root / "repo", offline_root=root / "offline"))
    engine.apply()
    return engine


def _value(rng: random.Random, value_type: ValueType):
    if value_type == ValueType.INT64:
        return rng.choice([0, -1, 2**62 + 3, -(2**63), rng.randrange(-1000, 10**12)])
    if value_type == ValueType.DOUBLE:
        return rng.choice([None, float("nan"), 0.0, -0.0, 0.1 + 0.2, 1e300, rng.random() * 1e6])
    if value_type == ValueType.STRING:
        return rng.choice(["", "ü ✓", "x" * 40, str(rng.random())])
    if value_type == ValueType.INT64_LIST:
        return [rng.randrange(-(2**63), 2**63) for _ in range(rng.choice([0, 1, 5]))]
    raise AssertionError(f"no test values for {value_type}")


def _rows(rng: random.Random, writer: OnlineWriter, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        at = datetime(2026, 1, 5, tzinfo=UTC) + timedelta(seconds=rng.uniform(0, 86_400 * 3))
        at = at.astimezone(timezone(timedelta(hours=rng.choice([0, 2, -5]))))  # any offset, one instant
        row = {k: rng.randrange(0, 2_000) for k, _ in writer.keys}
        rows.append(row | {"event_timestamp": at} | {f: _value(rng, t) for f, t in writer.feature_types})
    return rows


STREAMING_VIEWS = [v.name for v in catalogue.views if v.streaming]


def _table(writer: OnlineWriter) -> list[tuple]:
    return writer.connection.execute(f"SELECT * FROM {writer.table} ORDER BY 1, 2").fetchall()


@pytest.mark.parametrize("view", STREAMING_VIEWS)
def test_writes_the_rows_feast_writes(engine, view):
    """Random rows (each entity several times: the last write wins), through Feast's
    write_to_online_store, then the same through OnlineWriter into the emptied table: equal tables."""
    writer = OnlineWriter(engine.store, view)
    assert writer.writes_sqlite_directly, "the streaming views' types are all written directly"
    rows = _rows(random.Random(view), writer, 400)
    engine.store.write_to_online_store(view, pd.DataFrame(rows))
    feast_table = _table(writer)
    with writer.connection:
        writer.connection.execute(f"DELETE FROM {writer.table}")
    for start in range(0, len(rows), 97):  # in several batches, as the pusher writes
        writer.write(rows[start : start + 97])
    ours = _table(writer)
    assert len(ours) == len({tuple(r[k] for k, _ in writer.keys) for r in rows}) * len(writer.feature_types)
    assert ours == feast_table
