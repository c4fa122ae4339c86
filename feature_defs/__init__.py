"""mlplane's feature catalogue, declared with the DSL in `feature_defs.dsl`.

Importing this package validates every definition; `catalogue` holds them all.
"""

from feature_defs.dsl import Catalogue
from feature_defs.entities import item, user
from feature_defs.item_features import (
    item_content,
    item_geometry_view,
    item_popularity,
    item_sales_today,
    item_trending,
)
from feature_defs.safety_features import item_reports, user_chat, user_reports
from feature_defs.services import personalization_ranking, safety, search
from feature_defs.sources import (
    abuse_reports,
    chat_messages,
    creators,
    interaction_categories,
    interactions,
    item_geometry,
    items,
    users,
)
from feature_defs.user_features import user_activity_realtime, user_category_affinity, user_engagement, user_profile
from feature_defs.user_item_features import user_item_affinity

catalogue = Catalogue(
    entities=(user, item),
    sources=(interactions, chat_messages, abuse_reports, items, users, creators, item_geometry, interaction_categories),
    views=(
        user_profile,
        user_engagement,
        user_category_affinity,
        user_activity_realtime,
        item_popularity,
        item_trending,
        item_sales_today,
        item_content,
        item_geometry_view,
        user_item_affinity,
        user_reports,
        user_chat,
        item_reports,
    ),
    services=(personalization_ranking, search, safety),
)

__all__ = ["catalogue"]
