"""Reports that data scientists keep as notebooks, made daily pipelines by `notebook_pipeline`."""

from assets.ingestion import warehouse_key
from assets.notebooks import notebook_pipeline
from assets.partitions import daily_partitions
from feature_defs.sources import interactions

daily_top_items = notebook_pipeline(
    "examples/notebooks/daily_top_items.ipynb",
    description="The day's 20 most clicked items with impressions and click-through rate, in "
    "reports/daily_top_items/date=D",
    deps=[warehouse_key(interactions)],
    partitions_def=daily_partitions,
    hour_of_day=6,
)
