from feature_defs.dsl import FeatureService
from feature_defs.item_features import (
    item_content,
    item_geometry_view,
    item_popularity,
    item_sales_today,
    item_trending,
)
from feature_defs.safety_features import item_reports, user_chat, user_reports
from feature_defs.user_features import user_activity_realtime, user_category_affinity, user_engagement, user_profile
from feature_defs.user_item_features import user_item_affinity

personalization_ranking = FeatureService(
    "personalization_ranking",
    views=[
        user_profile,
        user_engagement,
        user_category_affinity,
        user_activity_realtime,
        item_popularity,
        item_trending,
        item_content,
        item_geometry_view,
        user_item_affinity,
    ],
    description="Features of a (user, item) pair for the recommendation ranker",
)

search = FeatureService(
    "search",
    views=[item_popularity, item_trending, item_sales_today, item_content, item_geometry_view],
    description="Item features for ranking search results",
)

safety = FeatureService(
    "safety",
    views=[user_reports, user_chat, item_reports],
    description="Signals for abuse and content-violation review",
)
