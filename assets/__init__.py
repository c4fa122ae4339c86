"""Software-defined assets, by domain. Each module owns its assets and their checks."""

from assets.datasets import dataset_assets
from assets.features import feature_store_assets, feature_table_assets
from assets.freshness import freshness_checks
from assets.ingestion import ingestion_assets
from assets.models import model_assets
from assets.quality import quality_assets

all_asset_checks = [*freshness_checks]
all_assets = [*ingestion_assets, *feature_table_assets, *feature_store_assets, *dataset_assets, *quality_assets,
              *model_assets]
