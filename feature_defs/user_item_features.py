from feature_defs.dsl import Feature, FeatureView, count, sum_
from feature_defs.entities import item, user
from feature_defs.funnel import click, impression, play, purchase
from feature_defs.sources import interactions

user_item_affinity = FeatureView(
    name="user_item_affinity",
    entities=[user, item],
    source=interactions,
    description="A user's history with one item",
    features=[
        Feature("impressions_30d", count("30d", where=impression)),
        Feature("clicks_30d", count("30d", where=click)),
        Feature("plays_30d", count("30d", where=play)),
        Feature("play_seconds_30d", sum_("play_seconds", "30d", where=play)),
        Feature("purchases_30d", count("30d", where=purchase)),
    ],
)
