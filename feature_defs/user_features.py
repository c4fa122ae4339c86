from feature_defs.dsl import Feature, FeatureView, count, distinct_count, last_n, mean, ratio, sum_, transform
from feature_defs.entities import user
from feature_defs.funnel import click, funnel_counts, impression, play, purchase
from feature_defs.sources import interactions, users

user_engagement = FeatureView(
    name="user_engagement",
    entities=[user],
    source=interactions,
    description="How much a user browses, clicks, plays and buys",
    features=[
        *funnel_counts,
        Feature("play_rate_7d", ratio("plays_7d", "clicks_7d"), "Plays per click over 7 days"),
        Feature("purchase_rate_30d", ratio("purchases_30d", "clicks_30d"), "Purchases per click over 30 days"),
        Feature("distinct_items_clicked_7d", distinct_count("item_id", "7d", where=click)),
        Feature("mean_play_seconds_7d", mean("play_seconds", "7d", where=play)),
        Feature("spend_30d", sum_("amount", "30d", where=purchase), "Money spent on items"),
        Feature("last_clicked_items", last_n("item_id", 10, "30d", where=click), "Last 10 items clicked"),
    ],
)

user_activity_realtime = FeatureView(
    name="user_activity_realtime",
    entities=[user],
    source=interactions,
    streaming=True,
    description="What a user did in the last hour; kept fresh by the streaming job",
    features=[
        Feature("impressions_1h", count("1h", where=impression)),
        Feature("clicks_1h", count("1h", where=click)),
        Feature("plays_1h", count("1h", where=play)),
        Feature("ctr_1h", ratio("clicks_1h", "impressions_1h")),
        Feature("last_played_items_1h", last_n("item_id", 5, "1h", where=play)),
    ],
)

user_profile = FeatureView(
    name="user_profile",
    entities=[user],
    source=users,
    description="Who the user is, from the user directory",
    features=[
        Feature("region", transform("region")),
        Feature("country", transform("country")),
        Feature("age_bucket", transform("age_bucket")),
        Feature("is_creator", transform("is_creator")),
    ],
)
