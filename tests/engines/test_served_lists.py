"""The simulated users' reaction to served lists (simulator.served_lists), checked against the
answer key's probabilities recomputed here: clicks only on shown items, at the rate rank and taste give,
plays only after a click, the interactions schema, and the same outcomes for the same seed."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import polars as pl

from simulator.answer_key import AnswerKey
from simulator.files import SCHEMAS
from simulator.served_lists import outcomes_of
from tests.engines.test_simulator import SMALL, START

SERVED_AT = datetime(2026, 1, 2, 9, 30, tzinfo=UTC)


def answers(users: list[int], lists: list[list[int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "request_id": [f"r{n}" for n in range(len(users))],
            "served_at": [SERVED_AT + timedelta(seconds=n) for n in range(len(users))],
            "user_id": users,
            "item_ids": lists,
        },
        schema_overrides={"served_at": pl.Datetime("us", "UTC")},
    )


def test_clicks_follow_rank_and_taste_and_only_shown_items_get_them():
    key = AnswerKey.on(SMALL, START)
    user, items = 3, [5, 17, 42]
    n = 4000
    outcomes = outcomes_of(answers([user] * n, [items] * n), key, seed=1)
    clicks = outcomes.filter(pl.col("event_type") == "click")
    assert set(clicks["item_id"]) <= set(items)
    for rank, item in enumerate(items, start=1):
        expected = key.click_probability(user, item) / math.log2(rank + 1)
        rate = clicks.filter(pl.col("item_id") == item).height / n
        assert abs(rate - expected) <= 4 * math.sqrt(expected * (1 - expected) / n) + 1e-9, (rank, rate, expected)
    plays = outcomes.filter(pl.col("event_type") == "play")
    assert plays.height and set(plays["session_id"] + plays["item_id"].cast(str)) <= set(
        clicks["session_id"] + clicks["item_id"].cast(str)
    )
    late = outcomes.filter(
        (pl.col("event_timestamp") < SERVED_AT)
        | (pl.col("event_timestamp") > SERVED_AT + timedelta(seconds=n, minutes=21))
    )
    assert late.is_empty()


def test_outcomes_are_interactions_rows_and_repeat_for_a_seed():
    key = AnswerKey.on(SMALL, START)
    served = answers([1, 2, 99999], [[1, 2, 3], [4, 5], [6]])  # user 99999 is not in the world: no clicks
    first = outcomes_of(served, key, seed=7)
    assert first.schema == pl.Schema(pl.from_arrow(SCHEMAS["interactions"].empty_table()).schema)
    assert first.equals(outcomes_of(served, key, seed=7))
    assert 99999 not in first["user_id"].to_list()
    assert first["event_id"].is_unique().all()
