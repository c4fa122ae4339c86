"""Asset jobs. The daily pipeline is partitioned: the schedule and the landing sensor run one day,
`dagster job backfill` or `dagster asset materialize --partition-range` run many."""

from dagster import AssetSelection, define_asset_job

from assets.partitions import daily_partitions

# Run tags that the production instance's queued run coordinator limits per pool.
CPU_POOL = {"mlplane/pool": "cpu"}
GPU_POOL = {"mlplane/pool": "gpu"}

daily_assets = AssetSelection.groups("ingestion", "features", "datasets") | AssetSelection.assets("online_features")

daily_pipeline = define_asset_job(
    "daily_pipeline",
    selection=daily_assets,
    partitions_def=daily_partitions,
    description="Ingest a day from landing, build its feature tables, load the online store and "
                "produce its training data.",
    tags=CPU_POOL,
)

feature_store_refresh = define_asset_job(
    "feature_store_refresh",
    selection=AssetSelection.assets("feature_registry", "data_quality_report"),
    description="feast apply of the feature DSL and a fresh data-quality report.",
    tags=CPU_POOL,
)

gateway_llm_training = define_asset_job(
    "gateway_llm_training",
    selection=AssetSelection.assets(["models", "gateway_llm"]),
    description="Train the small language model that the ML gateway's vLLM backends serve.",
    tags=CPU_POOL,
)

all_jobs = [daily_pipeline, feature_store_refresh, gateway_llm_training]
