"""One freshness policy for every daily asset: yesterday's partition is materialized by 06:00 UTC."""

from dagster import build_time_partition_freshness_checks

from assets.datasets import dataset_assets
from assets.features import feature_table_assets
from assets.ingestion import ingestion_assets

freshness_checks = build_time_partition_freshness_checks(
    assets=[*ingestion_assets, *feature_table_assets, *dataset_assets],
    deadline_cron="0 6 * * *",
    timezone="UTC",
)
