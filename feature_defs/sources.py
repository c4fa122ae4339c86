"""What mlplane ingests from landing (see docs/landing-format.md). Ingestion validates files
against these schemas, so the feature definitions and the loaders cannot disagree."""

from feature_defs.dsl import Source

interactions = Source(
    "interactions",
    kind="events",
    timestamp_field="event_timestamp",
    schema={
        "event_id": "string",
        "event_timestamp": "timestamp",
        "user_id": "int64",
        "item_id": "int64",
        "event_type": "string",
        "session_id": "string",
        "device": "string",
        "play_seconds": "float64",
        "amount": "float64",
    },
    key="event_id",
    description="Impressions, clicks, plays and purchases of items by users",
)

chat_messages = Source(
    "chat_messages",
    kind="events",
    timestamp_field="event_timestamp",
    schema={
        "message_id": "string",
        "event_timestamp": "timestamp",
        "sender_id": "int64",
        "receiver_id": "int64",
        "item_id": "int64",
        "text": "string",
    },
    key="message_id",
    description="Direct messages between users, sometimes about an item",
)

abuse_reports = Source(
    "abuse_reports",
    kind="events",
    timestamp_field="event_timestamp",
    schema={
        "report_id": "string",
        "event_timestamp": "timestamp",
        "reporter_id": "int64",
        "reported_user_id": "int64",
        "item_id": "int64",
        "reason": "string",
    },
    key="report_id",
    description="Reports filed by users against other users or items",
)

items = Source(
    "items",
    kind="table",
    timestamp_field="updated_at",
    key="item_id",
    schema={
        "item_id": "int64",
        "creator_id": "int64",
        "category": "string",
        "title": "string",
        "description": "string",
        "price": "float64",
        "thumbnail_path": "string",
        "mesh_path": "string",
        "created_at": "timestamp",
        "updated_at": "timestamp",
    },
    description="The item catalogue: new and changed items of each day",
)

users = Source(
    "users",
    kind="table",
    timestamp_field="updated_at",
    key="user_id",
    schema={
        "user_id": "int64",
        "country": "string",
        "region": "string",
        "age_bucket": "string",
        "is_creator": "bool",
        "signup_at": "timestamp",
        "updated_at": "timestamp",
    },
    description="User profiles: new and changed users of each day",
)

creators = Source(
    "creators",
    kind="table",
    timestamp_field="updated_at",
    key="creator_id",
    schema={
        "creator_id": "int64",
        "user_id": "int64",
        "display_name": "string",
        "joined_at": "timestamp",
        "updated_at": "timestamp",
    },
    description="Creator accounts that publish items",
)

item_geometry = Source(
    "item_geometry",
    kind="table",
    timestamp_field="updated_at",
    key="item_id",
    schema={
        "item_id": "int64",
        "updated_at": "timestamp",  # the catalogue row's, so versions line up with item_content
        "vertex_count": "int64",
        "face_count": "int64",
        "surface_area": "float64",
        "volume": "float64",
        "is_watertight": "bool",
        "bbox_x": "float64",
        "bbox_y": "float64",
        "bbox_z": "float64",
        "convex_hull_ratio": "float64",
        "symmetry_score": "float64",
        "silhouette_fill_top": "float64",
        "silhouette_fill_front": "float64",
        "silhouette_fill_side": "float64",
        "mesh_error": "string",
    },
    description="Geometry of each new or changed item's mesh, measured by the geometry job (Ray Data, trimesh)",
    produced_by="geometry/items",
)

interaction_categories = Source(
    "interaction_categories",
    kind="events",
    timestamp_field="event_timestamp",
    schema={
        "event_id": "string",
        "event_timestamp": "timestamp",
        "user_id": "int64",
        "item_id": "int64",
        "event_type": "string",
        "category": "string",
    },
    key="event_id",
    description="Interactions with the category of their item (from the catalogue as of the event), so that "
    "features can count a user's events per category",
    produced_by="warehouse/interaction_categories",
)

event_sources = (interactions, chat_messages, abuse_reports)
dimension_sources = (items, users, creators)
all_sources = event_sources + dimension_sources  # ingested from landing
derived_sources = (item_geometry, interaction_categories)  # computed by mlplane into the warehouse
