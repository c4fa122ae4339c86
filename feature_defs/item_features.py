from feature_defs.dsl import Feature, FeatureView, count, distinct_count, last_n, mean, ratio, sum_, transform
from feature_defs.entities import item
from feature_defs.expr import col
from feature_defs.funnel import click, funnel_counts, impression, play, purchase
from feature_defs.sources import interactions, item_geometry, items

item_popularity = FeatureView(
    name="item_popularity",
    entities=[item],
    source=interactions,
    description="How often an item is shown, clicked, played and bought",
    features=[
        *funnel_counts,
        Feature("conversion_rate_30d", ratio("purchases_30d", "clicks_30d")),
        Feature("distinct_users_7d", distinct_count("user_id", "7d"), "Users who saw or used the item"),
        Feature("revenue_30d", sum_("amount", "30d", where=purchase)),
        Feature("mean_play_seconds_7d", mean("play_seconds", "7d", where=play)),
    ],
)

item_trending = FeatureView(
    name="item_trending",
    entities=[item],
    source=interactions,
    streaming=True,
    description="What is hot right now; kept fresh by the streaming job",
    features=[
        Feature("impressions_1h", count("1h", where=impression)),
        Feature("clicks_1h", count("1h", where=click)),
        Feature("plays_1h", count("1h", where=play)),
        Feature("ctr_1h", ratio("clicks_1h", "impressions_1h")),
    ],
)

item_sales_today = FeatureView(
    name="item_sales_today",
    entities=[item],
    source=interactions,
    streaming=True,
    description="An item's running totals since midnight UTC; kept fresh by the streaming job",
    features=[
        Feature("clicks_today", count("1d", where=click, running=True)),
        Feature("purchases_today", count("1d", where=purchase, running=True)),
        Feature("buyers_today", distinct_count("user_id", "1d", where=purchase, running=True)),
        Feature("revenue_today", sum_("amount", "1d", where=purchase, running=True)),
        Feature("conversion_today", ratio("purchases_today", "clicks_today"), "Purchases per click since midnight"),
        Feature(
            "last_buyers_today",
            last_n("user_id", 5, "1d", where=purchase, running=True),
            "The last 5 users who bought the item since midnight",
        ),
    ],
)

item_content = FeatureView(
    name="item_content",
    entities=[item],
    source=items,
    description="Catalogue attributes of an item and simple transforms of them",
    features=[
        Feature("category", transform("category")),
        Feature("price", transform("price")),
        Feature("log_price", transform(col("price").log1p())),
        Feature("title_length", transform(col("title").str_len())),
        Feature("description_length", transform(col("description").str_len())),
    ],
)

item_geometry_view = FeatureView(
    name="item_geometry",
    entities=[item],
    source=item_geometry,
    description="Geometry of an item's 3D mesh, measured from the mesh file (null where the mesh is broken)",
    features=[
        Feature("vertex_count", transform("vertex_count")),
        Feature("face_count", transform("face_count")),
        Feature("surface_area", transform("surface_area"), "Square metres"),
        Feature("volume", transform("volume"), "Cubic metres; null unless the mesh is watertight"),
        Feature("is_watertight", transform("is_watertight")),
        Feature("bbox_volume", transform(col("bbox_x") * col("bbox_y") * col("bbox_z")), "Bounding box, cubic metres"),
        Feature("convex_hull_ratio", transform("convex_hull_ratio"), "Volume over convex hull volume (solidity)"),
        Feature("symmetry_score", transform("symmetry_score"), "Mirror symmetry of the silhouette from above, 0-1"),
        Feature("silhouette_fill_top", transform("silhouette_fill_top"), "Share of its box the top view fills"),
        Feature("silhouette_fill_front", transform("silhouette_fill_front")),
        Feature("silhouette_fill_side", transform("silhouette_fill_side")),
        Feature("is_broken", transform(col("mesh_error").is_not_null()), "The mesh could not be measured"),
    ],
)
