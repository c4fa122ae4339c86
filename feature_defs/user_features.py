from feature_defs.dsl import Feature, FeatureView, count, distinct_count, last_n, mean, ratio, sum_, transform
from feature_defs.entities import user
from feature_defs.expr import col
from feature_defs.funnel import click, funnel_counts, impression, play, purchase
from feature_defs.sources import interaction_categories, interactions, users

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

# The catalogue's item categories (the marketplace's fixed taxonomy; items.category takes these values).
ITEM_CATEGORIES = (
    "accessory",
    "building",
    "character",
    "food",
    "furniture",
    "hat",
    "pet",
    "plant",
    "vehicle",
    "weapon",
)
CATEGORY_WINDOWS = ("7d", "30d")


def _category_affinity_features() -> list[Feature]:
    """Per window: the user's impressions and clicks in all, then per category their counts and their
    shares of the window's total (null while the user has none)."""
    features = []
    for window in CATEGORY_WINDOWS:
        for event, where in (("impressions", impression), ("clicks", click)):
            features.append(Feature(f"{event}_{window}", count(window, where=where)))
            for category in ITEM_CATEGORIES:
                name = f"{event}_{window}_{category}"
                features.append(Feature(name, count(window, where=where & (col("category") == category))))
                share = f"{event.removesuffix('s')}_share_{window}_{category}"
                description = f"Share of the user's {event} over {window} that were of a {category} item"
                features.append(Feature(share, ratio(name, f"{event}_{window}"), description))
    return features


user_category_affinity = FeatureView(
    name="user_category_affinity",
    entities=[user],
    source=interaction_categories,
    description="A user's taste: the shares of each item category among the items shown to and clicked by the "
    "user over 7 and 30 days",
    features=_category_affinity_features(),
)
