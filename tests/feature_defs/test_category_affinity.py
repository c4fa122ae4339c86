"""The user-by-category affinity view: the catalogue's category joined to each interaction as of its time,
and the view's counts and shares against a plain recomputation from the raw events (fast tier, no engine
but polars and DuckDB)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import duckdb
import polars as pl
import pytest

from engines.data.interaction_categories import SCHEMA, categorized_interactions
from engines.data.lake import Lake
from feature_defs import catalogue
from feature_defs.compile.polars import build_daily_rows, day_end
from feature_defs.user_features import CATEGORY_WINDOWS, ITEM_CATEGORIES

VIEW = catalogue.view("user_category_affinity")
TS = pl.Datetime("us", "UTC")


def _write_items(lake: Lake, day: date, rows: list[tuple[int, str, datetime]]) -> None:
    frame = pl.DataFrame(rows, schema={"item_id": pl.Int64, "category": pl.String, "updated_at": TS}, orient="row")
    lake.write_partition("warehouse", "items", day, frame)


def _write_events(lake: Lake, day: date, rows: list[tuple[int, int, str, datetime]]) -> None:
    frame = pl.DataFrame(
        [(f"e{day}-{n}", at, user, item, kind) for n, (user, item, kind, at) in enumerate(rows)],
        schema={
            "event_id": pl.String,
            "event_timestamp": TS,
            "user_id": pl.Int64,
            "item_id": pl.Int64,
            "event_type": pl.String,
        },
        orient="row",
    )
    lake.write_partition("warehouse", "interactions", day, frame)


def test_each_interaction_gets_its_items_category_as_of_the_event(tmp_path):
    lake = Lake(tmp_path)
    day1, day2 = date(2026, 1, 1), date(2026, 1, 2)
    noon = datetime(2026, 1, 2, 12, tzinfo=UTC)
    _write_items(lake, day1, [(1, "pet", datetime(2026, 1, 1, 8, tzinfo=UTC))])
    # item 2 enters the catalogue after the first event that names it; item 1 is recategorized at noon
    _write_items(lake, day2, [(2, "hat", noon), (1, "food", noon)])
    _write_events(
        lake,
        day2,
        [(7, 1, "impression", noon - timedelta(hours=1)), (7, 2, "impression", noon - timedelta(minutes=1))]
        + [(7, 1, "click", noon), (8, 2, "click", noon + timedelta(hours=1)), (9, 3, "click", noon)],
    )
    frame = categorized_interactions(lake, day2)
    assert frame.schema == pl.Schema(SCHEMA)
    got = {
        (u, i, t.hour, t.minute): c
        for u, i, t, c in frame.select("user_id", "item_id", "event_timestamp", "category").iter_rows()
    }
    assert got == {
        (7, 1, 11, 0): "pet",
        (7, 2, 11, 59): None,  # not in the catalogue yet
        (7, 1, 12, 0): "food",  # the version written at the event's instant counts
        (8, 2, 13, 0): "hat",
        (9, 3, 12, 0): None,  # never in the catalogue
    }
    # the first day reads no later catalogue day
    _write_events(lake, day1, [(7, 2, "impression", datetime(2026, 1, 1, 23, tzinfo=UTC))])
    assert categorized_interactions(lake, day1).get_column("category").to_list() == [None]


def _events(seed: int = 3) -> pl.DataFrame:
    """Random impressions and clicks of 5 users over 40 days, some at exact window edges."""
    import random

    rng = random.Random(seed)
    end = day_end(date(2026, 2, 9))
    rows = []
    for n in range(600):
        at = end - timedelta(days=rng.choice([rng.uniform(0, 40), 7, 30, 0]))
        rows.append(
            (
                f"e{n}",
                at,
                rng.randint(1, 5),
                rng.randint(1, 50),
                rng.choice(["impression", "impression", "click", "play"]),
                rng.choice([*ITEM_CATEGORIES, None]),
            )
        )
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def _recomputed(events: pl.DataFrame, end: datetime) -> dict[int, dict[str, float | None]]:
    """The view's values from the raw rows, in plain Python: events in [end - window, end)."""
    users = {
        r["user_id"] for r in events.iter_rows(named=True) if end - timedelta(days=31) <= r["event_timestamp"] < end
    }
    out = {}
    for user in users:
        values: dict[str, float | None] = {}
        for window in CATEGORY_WINDOWS:
            start = end - timedelta(days=int(window.removesuffix("d")))
            mine = [
                r for r in events.iter_rows(named=True) if r["user_id"] == user and start <= r["event_timestamp"] < end
            ]
            for event, kind in (("impressions", "impression"), ("clicks", "click")):
                total = sum(r["event_type"] == kind for r in mine)
                values[f"{event}_{window}"] = total
                for category in ITEM_CATEGORIES:
                    n = sum(r["event_type"] == kind and r["category"] == category for r in mine)
                    values[f"{event}_{window}_{category}"] = n
                    values[f"{event.removesuffix('s')}_share_{window}_{category}"] = n / total if total else None
        out[user] = values
    return out


def test_counts_and_shares_equal_a_recomputation_from_raw_events():
    events = _events()
    day = date(2026, 2, 9)
    rows = build_daily_rows(VIEW, events.lazy(), day).collect()
    expected = _recomputed(events, day_end(day))
    assert sorted(rows.get_column("user_id").to_list()) == sorted(expected)
    for row in rows.iter_rows(named=True):
        mine = expected[row["user_id"]]
        for name, value in mine.items():
            assert row[name] == pytest.approx(value), (row["user_id"], name)
    # shares of a window add up to the share of events whose item had a category
    some = rows.row(0, named=True)
    assert 0 < sum(some[f"impression_share_30d_{c}"] or 0 for c in ITEM_CATEGORIES) <= 1 + 1e-9


def test_the_view_counts_in_sql_as_in_polars():
    """The view's filters compiled to SQL (DuckDB standing in for Flink's) count what its polars plan counts."""
    events = _events(seed=5)
    day = date(2026, 2, 9)
    end = day_end(day)
    rows = build_daily_rows(VIEW, events.lazy(), day).collect().sort("user_id")
    con = duckdb.connect()
    con.register("t", events.to_arrow())
    for feature in VIEW.features:
        spec = feature.spec
        if not hasattr(spec, "window"):
            continue
        start = end - spec.window_td
        sql = (
            f"SELECT user_id, count(*) FILTER (WHERE {spec.where.to_sql().replace('`', chr(34))}) FROM t "
            f"WHERE event_timestamp >= ? AND event_timestamp < ? GROUP BY user_id"
        )
        counted = dict(con.execute(sql, [start, end]).fetchall())
        got = dict(rows.select("user_id", feature.name).iter_rows())
        assert {u: counted.get(u, 0) for u in got} == got, feature.name
