"""Outcome attribution: the one rule by which a click or play is credited to what showed its item, shared
by online accuracy (an outcome -> the served answer) and the training labels (an outcome -> the
impression). Plain Python.

An outcome is credited to at most one exposure of its item to its user within `horizon` before it:
the one whose key the outcome echoes (a client sends back the request id, or the session, it acted
on), else the last of them (ties: the greater exposure id). Crediting every exposure that showed the
item would count one click two or three times, more often where lists repeat."""

from __future__ import annotations

from datetime import timedelta

import polars as pl

EXPOSURES = ("exposure", "user_id", "item_id", "shown_at", "key")
OUTCOMES = ("outcome", "user_id", "item_id", "at", "echoed")


def credit(exposures: pl.DataFrame, outcomes: pl.DataFrame, horizon: timedelta) -> pl.DataFrame:
    """One row per credited outcome: `outcome`, `exposure`. `exposures` holds EXPOSURES (`key`: what an
    outcome may echo, null for none); `outcomes` holds OUTCOMES (`echoed`: the key it echoes, or null)."""
    candidates = (
        outcomes.select(OUTCOMES)
        .join(exposures.select(EXPOSURES), on=["user_id", "item_id"])
        .filter((pl.col("at") >= pl.col("shown_at")) & (pl.col("at") <= pl.col("shown_at") + horizon))
        .with_columns((pl.col("key") == pl.col("echoed")).fill_null(False).alias("is_echoed"))
    )
    return (
        candidates.sort(["is_echoed", "shown_at", "exposure"], descending=True)
        .group_by("outcome", maintain_order=True)
        .first()
        .select("outcome", "exposure")
        .sort("outcome")
    )
