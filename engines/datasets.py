"""Training datasets: labelled impressions joined point-in-time with feature services."""

from __future__ import annotations

import polars as pl

from engines.feature_store import FeatureStoreEngine

LABEL_EVENTS = ("click", "play")


def labelled_impressions(interactions: pl.DataFrame) -> pl.DataFrame:
    """One row per impression: did the user click or play the shown item afterwards in the session,
    before the item was shown to them again? (A later impression gets its own outcome.)

    The row's `event_timestamp` is the impression time, so every feature joined to it was
    observed before the outcome it is labelled with.
    """
    shown = ["user_id", "item_id", "session_id"]
    impressions = (
        interactions.filter(pl.col("event_type") == "impression")
        .select("event_id", *shown, "event_timestamp")
        .sort("event_timestamp", "event_id")
        .with_columns(pl.col("event_timestamp").shift(-1).over(shown).alias("shown_again_at"))
    )
    outcomes = (
        interactions.filter(pl.col("event_type").is_in(LABEL_EVENTS))
        .select(*shown, "event_type", pl.col("event_timestamp").alias("outcome_at"))
    )
    joined = impressions.join(outcomes, on=shown, how="left")
    attributed = (pl.col("outcome_at") >= pl.col("event_timestamp")) & (
        pl.col("shown_again_at").is_null() | (pl.col("outcome_at") < pl.col("shown_again_at")))
    return (
        joined.group_by("event_id", *shown, "event_timestamp")
        .agg(
            (attributed & (pl.col("event_type") == "click")).any().alias("label_click"),
            (attributed & (pl.col("event_type") == "play")).any().alias("label_play"),
        )
        .sort("event_timestamp", "event_id")
    )


def training_rows(store: FeatureStoreEngine, labelled: pl.DataFrame, service: str) -> pl.DataFrame:
    """Join the service's features as of each row's `event_timestamp` (Feast historical retrieval)."""
    if labelled.is_empty():
        raise ValueError("no labelled rows to build a training set from")
    features = store.historical_features(labelled.to_pandas(), service)
    return pl.from_pandas(features).sort("event_timestamp", "event_id")
