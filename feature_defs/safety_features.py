from feature_defs.dsl import Feature, FeatureView, count, distinct_count, ratio
from feature_defs.entities import item, user
from feature_defs.expr import col
from feature_defs.sources import abuse_reports, chat_messages

user_reports = FeatureView(
    name="user_reports",
    entities=[user],
    source=abuse_reports,
    entity_columns={"user_id": "reported_user_id"},
    description="Reports filed against a user",
    features=[
        Feature("reports_received_7d", count("7d")),
        Feature("reports_received_30d", count("30d")),
        Feature("distinct_reporters_30d", distinct_count("reporter_id", "30d")),
        Feature("harassment_reports_30d", count("30d", where=col("reason") == "harassment")),
        Feature("scam_reports_30d", count("30d", where=col("reason") == "scam")),
    ],
)

user_chat = FeatureView(
    name="user_chat",
    entities=[user],
    source=chat_messages,
    entity_columns={"user_id": "sender_id"},
    description="How a user messages others; bursts to many strangers signal spam",
    features=[
        Feature("messages_sent_1d", count("1d")),
        Feature("messages_sent_7d", count("7d")),
        Feature("distinct_receivers_1d", distinct_count("receiver_id", "1d")),
        Feature("distinct_receivers_7d", distinct_count("receiver_id", "7d")),
        Feature("receivers_per_message_7d", ratio("distinct_receivers_7d", "messages_sent_7d")),
    ],
)

item_reports = FeatureView(
    name="item_reports",
    entities=[item],
    source=abuse_reports,
    description="Reports filed against an item",
    features=[
        Feature("reports_7d", count("7d")),
        Feature("ip_violation_reports_30d", count("30d", where=col("reason") == "ip_violation")),
        Feature("distinct_reporters_30d", distinct_count("reporter_id", "30d")),
    ],
)
