"""Training datasets: labelled impressions joined point-in-time with feature services."""

from __future__ import annotations

import polars as pl

from engines.feature_store import FeatureStoreEngine
from feature_defs.compile.polars import POLARS_TYPES
from feature_defs.dsl import Catalogue

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
    features = pl.from_pandas(store.historical_features(labelled.to_pandas(), service))
    return features.with_columns(_declared(features, column, dtype) for column, dtype
                                 in feature_types(store.catalogue, service).items()).sort("event_timestamp", "event_id")


def feature_types(catalogue: Catalogue, service: str) -> dict[str, pl.DataType]:
    """`<view>__<feature>` -> its declared polars type, for every feature of a service."""
    return {f"{view.name}__{feature.name}": POLARS_TYPES[view.dtype_of(feature)]
            for view in catalogue.service(service).views for feature in view.features}


def _declared(frame: pl.DataFrame, column: str, dtype: pl.DataType) -> pl.Expr:
    # A feature no entity has a value for on a day comes back as untyped nulls; every partition of a
    # dataset must have the same schema, so it gets its declared type.
    if frame.get_column(column).null_count() == frame.height:
        return pl.lit(None, dtype=dtype).alias(column)
    return pl.col(column).cast(dtype)
