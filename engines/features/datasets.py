"""Training datasets: labelled impressions joined with feature services as of the impression time
(engines.features.point_in_time, the one definition every reader uses)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import polars as pl

from engines.experimentation import attribution
from engines.features.point_in_time import LIVE_TIMING, AsOfResult, Timing, features_as_of
from feature_defs import catalogue as default_catalogue
from feature_defs.dsl import Catalogue

LABEL_EVENTS = ("click", "play")
# An impression is labelled by a click or play credited to it within this time after it. Late
# impressions of a day need the first LABEL_HORIZON of the next day: a day's dataset waits for it.
LABEL_HORIZON = timedelta(minutes=30)


@dataclass
class Labelled:
    rows: pl.DataFrame  # one row per labelled impression
    without_session: int  # impressions left out of the rows: no session id (they still take credit)


def labelled_impressions(
    interactions: pl.DataFrame,
    next_day: pl.DataFrame | None = None,
    horizon: timedelta = LABEL_HORIZON,
    previous_day: pl.DataFrame | None = None,
) -> Labelled:
    """One row per impression of the day in `interactions` with a session id: was a click or play credited
    to it? Each outcome is credited to at most one impression of its item to its user within `horizon`
    before it, by the rule online accuracy uses (engines.experimentation.attribution): the impression whose session the
    outcome echoes (its `session_id`), else the last one (ties: the greater event id). So a later
    impression takes the outcome from an earlier one, and one click labels one impression, never two.
    Impressions and outcomes are looked up in the day and in `next_day` (the next day's interactions,
    at least its first `horizon`), so an impression at 23:50 can be labelled by a click at 00:10. The
    impressions of `previous_day` (its last `horizon` suffices) only take credit: a click after midnight
    that echoes yesterday's session goes to yesterday's impression, not to one of today's.

    Impressions without a session id take credit like any other but get no row (they are counted): a
    training row is an impression of a known visit.

    The row's `event_timestamp` is the impression time, so every feature joined to it was
    observed before the outcome it is labelled with.
    """
    events = pl.concat([interactions, next_day], how="diagonal_relaxed") if next_day is not None else interactions
    seen = pl.concat([previous_day, events], how="diagonal_relaxed") if previous_day is not None else events
    shown = seen.filter(pl.col("event_type") == "impression")
    exposures = shown.select(
        pl.col("event_id").alias("exposure"),
        "user_id",
        "item_id",
        pl.col("event_timestamp").alias("shown_at"),
        pl.col("session_id").alias("key"),
    )
    outcomes = (
        events.filter(pl.col("event_type").is_in(LABEL_EVENTS))
        .with_row_index("outcome")
        .select(
            "outcome",
            "user_id",
            "item_id",
            pl.col("event_timestamp").alias("at"),
            pl.col("session_id").alias("echoed"),
            "event_type",
        )
    )
    credited = attribution.credit(exposures, outcomes, horizon).join(
        outcomes.select("outcome", "event_type"), on="outcome"
    )
    labels = credited.group_by("exposure").agg(
        (pl.col("event_type") == "click").any().alias("label_click"),
        (pl.col("event_type") == "play").any().alias("label_play"),
    )
    day = interactions.filter(pl.col("event_type") == "impression")
    rows = (
        day.filter(pl.col("session_id").is_not_null())
        .select("event_id", "user_id", "item_id", "session_id", "event_timestamp")
        .join(labels, left_on="event_id", right_on="exposure", how="left")
        .with_columns(pl.col("label_click", "label_play").fill_null(False))
        .sort("event_timestamp", "event_id")
    )
    return Labelled(rows, day.height - rows.height)


def service_features(catalogue: Catalogue, service: str) -> list[str]:
    """`<view>__<feature>` of every feature of a service."""
    return [f"{view.name}__{f.name}" for view in catalogue.service(service).views for f in view.features]


def training_rows(
    lake_root: Path,
    labelled: pl.DataFrame,
    service: str,
    timing: Timing = LIVE_TIMING,
    catalogue: Catalogue = default_catalogue,
) -> AsOfResult:
    """The service's features as of each row's `event_timestamp` (engines.features.point_in_time)."""
    if labelled.is_empty():
        raise ValueError("no labelled rows to build a training set from")
    result = features_as_of(lake_root, service_features(catalogue, service), labelled, timing, catalogue)
    result.frame = result.frame.sort("event_timestamp", "event_id")
    return result
