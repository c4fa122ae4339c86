"""Training datasets: labelled impressions joined with feature services as of the impression time
(engines.point_in_time, the one definition every reader uses)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import polars as pl

from engines.point_in_time import LIVE_TIMING, AsOfResult, Timing, features_as_of
from feature_defs import catalogue as default_catalogue
from feature_defs.dsl import Catalogue

LABEL_EVENTS = ("click", "play")
# An impression is labelled by a click or play in the same session within this time after it. Late
# impressions of a day need the first LABEL_HORIZON of the next day: a day's dataset waits for it.
LABEL_HORIZON = timedelta(minutes=30)


@dataclass
class Labelled:
    rows: pl.DataFrame  # one row per labelled impression
    without_session: int  # impressions dropped: no session id, so no outcome can be attributed


def labelled_impressions(
    interactions: pl.DataFrame, next_day: pl.DataFrame | None = None, horizon: timedelta = LABEL_HORIZON
) -> Labelled:
    """One row per impression of the day in `interactions`: did the user click or play the shown item
    within `horizon` after it, in the same session, before the item was shown to them again? (A
    later impression gets its own outcome.) Outcomes are looked up in the day and in `next_day` (the
    next day's interactions, at least its first `horizon`), so an impression at 23:50 can be labelled
    by a click at 00:10.

    Impressions without a session id are dropped and counted: the label is defined per session, and
    guessing one (by user and item alone) would attribute clicks from unrelated visits.

    The row's `event_timestamp` is the impression time, so every feature joined to it was
    observed before the outcome it is labelled with.
    """
    shown = ["user_id", "item_id", "session_id"]
    events = pl.concat([interactions, next_day]) if next_day is not None else interactions
    all_impressions = interactions.filter(pl.col("event_type") == "impression")
    impressions = (
        all_impressions.filter(pl.col("session_id").is_not_null())
        .select("event_id", *shown, "event_timestamp")
        .sort("event_timestamp", "event_id")
        .with_columns(pl.col("event_timestamp").shift(-1).over(shown).alias("shown_again_at"))
    )
    outcomes = events.filter(pl.col("event_type").is_in(LABEL_EVENTS)).select(
        *shown, "event_type", pl.col("event_timestamp").alias("outcome_at")
    )
    joined = impressions.join(outcomes, on=shown, how="left")
    attributed = (
        (pl.col("outcome_at") >= pl.col("event_timestamp"))
        & (pl.col("outcome_at") < pl.col("event_timestamp") + horizon)
        & (pl.col("shown_again_at").is_null() | (pl.col("outcome_at") < pl.col("shown_again_at")))
    )
    rows = (
        joined.group_by("event_id", *shown, "event_timestamp")
        .agg(
            (attributed & (pl.col("event_type") == "click")).any().alias("label_click"),
            (attributed & (pl.col("event_type") == "play")).any().alias("label_play"),
        )
        .sort("event_timestamp", "event_id")
    )
    return Labelled(rows, all_impressions.height - impressions.height)


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
    """The service's features as of each row's `event_timestamp` (engines.point_in_time)."""
    if labelled.is_empty():
        raise ValueError("no labelled rows to build a training set from")
    result = features_as_of(lake_root, service_features(catalogue, service), labelled, timing, catalogue)
    result.frame = result.frame.sort("event_timestamp", "event_id")
    return result
