"""The feature store's materialization into SQLite (its rows written by OnlineWriter) loads what Feast's
own materialization loads: random offline tables of every batch view of the catalogue, with missing
values, NaNs, rows on and beyond the interval's bounds, into two stores: equal tables and intervals."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest

from engines.features.feature_store import EPOCH, FeatureStoreEngine, FeatureStoreSettings
from engines.features.online_write import OnlineWriter, latest_offline_rows
from feature_defs import catalogue

FIRST, LAST = date(2026, 3, 2), date(2026, 3, 3)
START = datetime(2026, 3, 2, tzinfo=UTC)
END = datetime(2026, 3, 4, tzinfo=UTC)  # materialize_days(FIRST, LAST) loads up to LAST's end, included
BATCH_VIEWS = [v for v in catalogue.views if not v.streaming]
POLARS_TYPES = {"int64": pl.Int64, "float64": pl.Float64, "string": pl.String, "bool": pl.Boolean}
POLARS_TYPES |= {"int64_list": pl.List(pl.Int64)}


def _value(rng: random.Random, dtype: str):
    if rng.random() < 0.1:
        return None
    if dtype == "int64":
        return rng.choice([0, -1, 2**53 - 1, rng.randrange(-1000, 10**9)])  # beyond 2**53: test_large_integers
    if dtype == "float64":
        return rng.choice([float("nan"), 0.0, -0.0, 0.1 + 0.2, 1e300, float("inf"), rng.random() * 1e6])
    if dtype == "string":
        return rng.choice(["", "ü ✓", str(rng.random())])
    if dtype == "bool":
        return rng.random() < 0.5
    if dtype == "int64_list":
        return [rng.randrange(-(2**40), 2**40) for _ in range(rng.choice([0, 1, 4]))]
    raise AssertionError(f"no test values for {dtype}")


def _stamps(rng: random.Random, n: int) -> list[datetime]:
    """Distinct instants from a day before the interval to a day after, its bounds among them."""
    seconds = rng.sample(range(-86_400, 3 * 86_400), n - 2)
    return [START, END] + [START + timedelta(seconds=s, microseconds=rng.randrange(10**6)) for s in seconds]


def _write_offline(root, view, rng: random.Random) -> None:
    """Three partitions of random rows; an entity appears several times, at distinct instants."""
    keys = [e.join_key for e in view.entities]
    stamps = _stamps(rng, 240)
    columns = {k: pl.Int64 for k in keys} | {"event_timestamp": pl.Datetime("us", "UTC")}
    columns |= {f.name: POLARS_TYPES[view.dtype_of(f)] for f in view.features}
    rows = [
        {k: rng.randrange(40) for k in keys}
        | {"event_timestamp": at}
        | {f.name: _value(rng, view.dtype_of(f)) for f in view.features}
        for at in stamps
    ]
    seen = set()  # one row per entity and instant: Feast keeps either of two alike
    rows = [r for r in rows if (key := (*[r[k] for k in keys], r["event_timestamp"])) not in seen and not seen.add(key)]
    for n in range(3):
        part = root / view.name / f"date=2026-03-0{n + 1}"
        part.mkdir(parents=True)
        pl.DataFrame(rows[n::3], schema=columns).write_parquet(part / "part-0.parquet")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("materialize")
    rng = random.Random(20260302)
    for view in BATCH_VIEWS:
        _write_offline(root / "offline", view, rng)
    made = {}
    for name in ("feast", "ours"):
        engine = FeatureStoreEngine(FeatureStoreSettings(repo_dir=root / name, offline_root=root / "offline"))
        engine.apply()
        made[name] = engine
    # Feast's own materialization, as materialize_days asked for it before OnlineWriter wrote the rows
    feast = made["feast"].store
    feast.materialize(START, END, feature_views=[v.name for v in BATCH_VIEWS if not v.is_table_view])
    feast.materialize(EPOCH, END, feature_views=[v.name for v in BATCH_VIEWS if v.is_table_view])
    made["ours"].materialize_days(FIRST, LAST, BATCH_VIEWS)
    return made


@pytest.mark.parametrize("view", [v.name for v in BATCH_VIEWS])
def test_materialization_loads_what_feast_loads(engines, view):
    feast, ours = (OnlineWriter(engines[name].store, view) for name in ("feast", "ours"))
    assert ours.writes_sqlite_directly, f"{view}'s types are all written directly"
    table = f"SELECT * FROM {ours.table} ORDER BY entity_key, feature_name"
    expected = feast.connection.execute(table).fetchall()
    assert expected, "Feast loaded rows of the view: the comparison is not of two empty tables"
    assert ours.connection.execute(table).fetchall() == expected
    intervals = [engines[name].store.get_feature_view(view).materialization_intervals for name in ("feast", "ours")]
    assert intervals[0], "Feast recorded the interval"
    assert intervals[1] == intervals[0]


def test_latest_rows_bounds_and_ties(tmp_path):
    """Both bounds included; of two rows of an entity stamped alike, the later partition's."""
    schema = {"user_id": pl.Int64, "event_timestamp": pl.Datetime("us", "UTC"), "clicks": pl.Int64}
    parts = {
        "date=2026-03-01": [(1, START - timedelta(microseconds=1), 1), (2, START, 2), (3, END, 3)],
        "date=2026-03-02": [(3, END + timedelta(microseconds=1), 4), (4, START, 5)],
        "date=2026-03-03": [(4, START, 6), (1, START, 7), (1, START + timedelta(hours=1), 8)],
    }
    for name, rows in parts.items():
        (tmp_path / name).mkdir()
        pl.DataFrame(rows, schema=schema, orient="row").write_parquet(tmp_path / name / "part-0.parquet")
    latest = latest_offline_rows(tmp_path, ["user_id"], ["clicks"], START, END)
    assert sorted((r["user_id"], r["clicks"]) for r in latest) == [(1, 8), (2, 2), (3, 3), (4, 6)]
    assert latest_offline_rows(tmp_path / "none", ["user_id"], ["clicks"], START, END) == []


def test_large_integers_stay_exact(tmp_path):
    """An int64 beyond 2**53 in a column with a missing value loads exact (Feast's materialization goes
    through pandas there, which makes the column float: 2**62 + 3 came back as 2**62)."""
    view = next(v for v in BATCH_VIEWS if v.name == "user_reports")
    part = tmp_path / "offline" / view.name / "date=2026-03-02"
    part.mkdir(parents=True)
    first, *rest = [f.name for f in view.features]
    rows = {"user_id": [1, 2], "event_timestamp": [START, START], first: [2**62 + 3, None]}
    rows |= {name: [7, 8] for name in rest}
    pl.DataFrame(rows, schema_overrides={"event_timestamp": pl.Datetime("us", "UTC")}).write_parquet(
        part / "part-0.parquet"
    )
    engine = FeatureStoreEngine(FeatureStoreSettings(repo_dir=tmp_path / "repo", offline_root=tmp_path / "offline"))
    engine.apply()
    engine.materialize_days(FIRST, LAST, [view])
    found = engine.online_view(view.name, [{"user_id": 1}, {"user_id": 2}], [first, rest[0]])
    assert [values for _, values in found] == [{first: 2**62 + 3, rest[0]: 7}, {first: None, rest[0]: 8}]
