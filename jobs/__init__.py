"""Asset jobs. The daily pipeline is partitioned: the schedule and the landing sensor run one day,
`dagster job backfill` or `dagster asset materialize --partition-range` run many. Every job defined
here is loaded by orchestration/definitions.py; pipelines' jobs come with their assets."""

from dagster import AssetSelection, define_asset_job

# Run tags that the production instance's queued run coordinator limits per pool.
CPU_POOL = {"mlplane/pool": "cpu"}
GPU_POOL = {"mlplane/pool": "gpu"}

daily_assets = AssetSelection.groups("ingestion", "geometry", "features") | AssetSelection.assets("online_features")
# A day's training set labels its late impressions with the next day's first minutes, so it is built
# once the next day is ingested, together with the streaming history its streaming features come from.
training_data_assets = AssetSelection.groups("streaming_history", "datasets")

daily_pipeline = define_asset_job(
    "daily_pipeline",
    selection=daily_assets,
    description="Ingest a day from landing, measure its new and changed items' meshes (Ray), build its feature "
    "tables and load the online store.",
    tags=CPU_POOL,
)

training_data = define_asset_job(
    "training_data",
    selection=training_data_assets,
    description="The streaming views' history (Flink batch) and the labelled training set of a day, once the "
    "next day's interactions are ingested (the label horizon reaches past midnight).",
    tags=CPU_POOL,
)

feature_store_refresh = define_asset_job(
    "feature_store_refresh",
    selection=AssetSelection.assets("feature_registry", "data_quality_report"),
    description="feast apply of the feature DSL and a fresh data-quality report.",
    tags=CPU_POOL,
)

item_embeddings_daily = define_asset_job(
    "item_embeddings_daily",
    selection=AssetSelection.assets(
        ["embeddings", "items"],
        ["content_violations", "flags"],
        ["vectors", "items"],
        ["monitoring", "violation_accuracy"],
    ),
    description="Embed the day's new and changed items with CLIP (Ray Data), flag likely content violations, "
    "measure the flags against the newest ground-truth release and sync the Qdrant collection. Needs the "
    "clip_model asset.",
    tags=CPU_POOL,
)

clip_reembed = define_asset_job(
    "clip_reembed",
    selection=AssetSelection.assets(
        ["models", "clip"], ["embeddings", "items"], ["content_violations", "flags"], ["vectors", "items"]
    ),
    description="Re-embed every embedded day with the registry's champion CLIP, flag copies again in its "
    "embedding space and bring the vector index to that version alone; clip_champion_sensor runs it.",
    tags=CPU_POOL,
)

batch_inference = define_asset_job(
    "batch_inference",
    selection=AssetSelection.groups("inference", "experiments"),
    description="The champion model's daily recommendations for every active user (Ray Data, vector database) "
    "and the offline reports of the A/B experiments.",
    tags=CPU_POOL,
)

streaming_backfill = define_asset_job(
    "streaming_backfill",
    selection=AssetSelection.groups("streaming_history"),
    description="Every window of the streaming views over historical days: the streaming jobs' SQL in Flink "
    "batch mode over landing, checked against the offline feature tables. A partition range "
    "runs as one Flink job.",
    tags=CPU_POOL,
)

gateway_llm_training = define_asset_job(
    "gateway_llm_training",
    selection=AssetSelection.assets(["models", "gateway_llm"], ["models", "gateway_llm_draft"]),
    description="Train the small language model that the ML gateway's vLLM backends serve and its draft model "
    "for speculative decoding; both registered in MLflow with their lineage.",
    tags=CPU_POOL,
)

llm_batch_daily = define_asset_job(
    "llm_batch_daily",
    selection=AssetSelection.assets(["llm", "item_descriptions"]),
    description="Batch LLM inference: descriptions for the day's items whose description is empty, through the "
    "ML gateway (service key MLPLANE_GATEWAY_KEY).",
    tags=CPU_POOL,
)

ground_truth_queues = define_asset_job(
    "ground_truth_queues",
    selection=AssetSelection.assets(
        ["ground_truth", "content_violation", "queue"], ["ground_truth", "recommendation_relevance", "queue"]
    ),
    description="Fill the labeling queues with the day's flagged items, detector-vs-reports disagreements, "
    "champion-vs-challenger disagreements and a random audit sample (idempotent).",
    tags=CPU_POOL,
)

model_export = define_asset_job(
    "model_export",
    selection=AssetSelection.assets(["deploy", "model_export"]),
    description="Export the served models for KServe (InferenceServices) and Triton (a TorchScript model "
    "repository) from the registry; model_export_sensor runs it when a served version changes.",
    tags=CPU_POOL,
)

online_monitoring = define_asset_job(
    "online_monitoring",
    selection=AssetSelection.assets(["serving", "prediction_logs"], ["monitoring", "online_accuracy"]),
    description="Take the model server's prediction log of a day in and score every served version and variant "
    "on the clicks and plays that followed (online accuracy, A/B comparisons, shadows). Today's partition "
    "can run before midnight (what has been served and clicked so far).",
    tags=CPU_POOL,
)
