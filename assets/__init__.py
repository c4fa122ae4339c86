"""Software-defined assets, by domain. Each module owns its assets and their checks."""

from assets.datasets import dataset_assets
from assets.embeddings import embedding_assets
from assets.experiments import experiment_assets
from assets.features import feature_store_assets, feature_table_assets
from assets.freshness import freshness_checks
from assets.inference import inference_assets
from assets.ingestion import ingestion_assets
from assets.llm import llm_assets
from assets.models import model_assets
from assets.quality import quality_assets
from assets.serving import serving_assets
from assets.streaming import streaming_assets, streaming_history_assets

all_asset_checks = [*freshness_checks]
all_assets = [*ingestion_assets, *feature_table_assets, *feature_store_assets, *dataset_assets, *quality_assets,
              *embedding_assets, *streaming_assets, *streaming_history_assets, *model_assets, *inference_assets,
              *experiment_assets, *llm_assets, *serving_assets]
