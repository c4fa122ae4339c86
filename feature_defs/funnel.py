"""The marketplace funnel (impression -> click -> play -> purchase): the event filters, and the
counts that every entity seen in interactions gets."""

from feature_defs.dsl import Feature, count, ratio
from feature_defs.expr import col

impression = col("event_type") == "impression"
click = col("event_type") == "click"
play = col("event_type") == "play"
purchase = col("event_type") == "purchase"

funnel_counts = [
    Feature("impressions_7d", count("7d", where=impression)),
    Feature("clicks_7d", count("7d", where=click)),
    Feature("plays_7d", count("7d", where=play)),
    Feature("purchases_30d", count("30d", where=purchase)),
    Feature("clicks_30d", count("30d", where=click)),
    Feature("ctr_7d", ratio("clicks_7d", "impressions_7d"), "Click-through rate over 7 days"),
]
