"""Training labels (engines.features.datasets.labelled_impressions) against a plain recomputation from the raw
events: each click or play credited to one impression of its item to its user within the horizon before
it, the one whose session it echoes, else the last (ties: the greater event id), as online accuracy
credits answers (engines.experimentation.attribution, shared)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from engines.features.datasets import LABEL_HORIZON, labelled_impressions

DAY = datetime(2026, 5, 4, tzinfo=UTC)
SCHEMA = {
    "event_id": pl.String,
    "user_id": pl.Int64,
    "item_id": pl.Int64,
    "event_type": pl.String,
    "session_id": pl.String,
    "event_timestamp": pl.Datetime("us", "UTC"),
}


def random_events(seed: int, n: int = 3000) -> list[dict]:
    """Impressions, clicks and plays of few users and items over the day and the hours around it, on
    whole minutes (so ties and outcomes exactly at the horizon occur); outcomes echo a session of their
    user, a foreign one, or none."""
    rng = random.Random(seed)
    events = []
    for i in range(n):
        user = rng.randrange(30)
        kind = rng.choice(["impression"] * 3 + ["click", "play"])
        session = rng.choice([f"s{user}-{rng.randrange(4)}", f"s{user}-{rng.randrange(4)}", "elsewhere", None])
        minute = rng.randrange(-60, 25 * 60) if rng.random() < 0.5 else rng.randrange(23 * 60, 25 * 60)
        events.append(
            {
                "event_id": f"e{i:05d}",
                "user_id": user,
                "item_id": rng.randrange(8),
                "event_type": kind,
                "session_id": session,
                "event_timestamp": DAY + timedelta(minutes=minute),
            }
        )
    return events


def plain_labels(
    events: list[dict], horizon: timedelta, since: datetime, until: datetime
) -> dict[str, tuple[bool, bool]]:
    """Event id of each impression with a session in [since, until) -> (clicked, played), by loops."""
    impressions = [e for e in events if e["event_type"] == "impression"]
    shown_to: dict[tuple, list[dict]] = {}
    for i in impressions:
        shown_to.setdefault((i["user_id"], i["item_id"]), []).append(i)
    credited: dict[str, set[str]] = {}
    for outcome in events:
        if outcome["event_type"] not in ("click", "play"):
            continue
        at = outcome["event_timestamp"]
        showed = [
            i
            for i in shown_to.get((outcome["user_id"], outcome["item_id"]), [])
            if i["event_timestamp"] <= at <= i["event_timestamp"] + horizon
        ]
        echoed = [i for i in showed if i["session_id"] is not None and i["session_id"] == outcome["session_id"]]
        pool = echoed or showed
        if pool:
            chosen = max(pool, key=lambda i: (i["event_timestamp"], i["event_id"]))
            credited.setdefault(chosen["event_id"], set()).add(outcome["event_type"])
    return {
        i["event_id"]: ("click" in credited.get(i["event_id"], ()), "play" in credited.get(i["event_id"], ()))
        for i in impressions
        if i["session_id"] is not None and since <= i["event_timestamp"] < until
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_labels_credit_each_outcome_to_one_impression_as_a_plain_recomputation_does(seed):
    events = random_events(seed)
    frame = pl.DataFrame(events, schema=SCHEMA)
    before, after = pl.col("event_timestamp") < DAY, pl.col("event_timestamp") >= DAY + timedelta(days=1)
    labelled = labelled_impressions(
        frame.filter(~before & ~after), frame.filter(after), previous_day=frame.filter(before)
    )
    got = {e: (c, p) for e, c, p in labelled.rows.select("event_id", "label_click", "label_play").iter_rows()}
    expected = plain_labels(events, LABEL_HORIZON, DAY, DAY + timedelta(days=1))
    rng = random.Random(seed)
    for user in rng.sample(range(30), 10):  # random users, all their rows: what a reader would check by hand
        mine = [e["event_id"] for e in events if e["user_id"] == user and e["event_id"] in expected]
        assert {e: got[e] for e in mine} == {e: expected[e] for e in mine}, user
    assert got == expected
    assert 0 < sum(c for c, _ in got.values()) < len(got)  # both labels occur
    no_session = sum(1 for e in events if e["event_type"] == "impression" and e["session_id"] is None)
    assert (
        labelled.without_session
        == sum(
            1
            for e in events
            if e["event_type"] == "impression"
            and e["session_id"] is None
            and DAY <= e["event_timestamp"] < DAY + timedelta(days=1)
        )
        and no_session > 0
    )


def test_one_click_after_two_impressions_labels_only_the_one_it_echoes_else_the_last():
    at = DAY + timedelta(hours=12)
    rows = pl.DataFrame(
        {
            "event_id": ["a", "b", "c", "d"],
            "user_id": [1, 1, 1, 1],
            "item_id": [5, 5, 5, 5],
            "event_type": ["impression", "impression", "click", "click"],
            "session_id": ["s1", "s2", "s1", None],
            "event_timestamp": [at, at + timedelta(minutes=5), at + timedelta(minutes=10), at + timedelta(minutes=11)],
        },
        schema=SCHEMA,
    )
    labels = dict(labelled_impressions(rows).rows.select("event_id", "label_click").iter_rows())
    assert labels == {"a": True, "b": True}  # c echoes s1; d echoes nothing: the last, b
    without_echo = rows.filter(pl.col("event_id") != "c")
    assert dict(labelled_impressions(without_echo).rows.select("event_id", "label_click").iter_rows()) == {
        "a": False,
        "b": True,
    }
