"""The `interaction_categories` warehouse table: each interaction of a day with its item's category as the
catalogue stated it at the event's time (the newest items row with `updated_at` at or before the event), so
that feature views count a user's events per category. Plain polars, no Dagster."""

from __future__ import annotations

from datetime import date

import polars as pl

from engines.data.lake import Lake
from feature_defs.compile.polars import POLARS_TYPES
from feature_defs.sources import interaction_categories, interactions, items

SCHEMA = {name: POLARS_TYPES[dtype] for name, dtype in interaction_categories.schema.items()}


def categorized_interactions(lake: Lake, day: date) -> pl.DataFrame:
    """The day's interactions with their item's category (null for an item the catalogue did not know yet)."""
    events = lake.read_partition("warehouse", interactions.name, day).select([c for c in SCHEMA if c != "category"])
    known = [d for d in lake.partition_days("warehouse", items.name) if d <= day]
    catalogue = lake.scan_partitions("warehouse", items.name, known)
    if catalogue is None or events.is_empty():
        return events.with_columns(pl.lit(None, pl.String).alias("category")).select(
            [pl.col(c).cast(t) for c, t in SCHEMA.items()]
        )
    versions = catalogue.select("item_id", pl.col("updated_at").alias("_at"), "category").collect()
    # both sorted by time as a whole, hence within each item too (which polars cannot check by itself)
    joined = events.sort("event_timestamp").join_asof(
        versions.sort("_at"),
        left_on="event_timestamp",
        right_on="_at",
        by="item_id",
        strategy="backward",
        check_sortedness=False,
    )
    return joined.select([pl.col(c).cast(t) for c, t in SCHEMA.items()]).sort("event_timestamp", "event_id")
