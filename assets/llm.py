"""Models the platform trains itself. `gateway_llm` is the small language model the ML gateway's
vLLM backends serve: trained on the marketplace's own text, saved in Hugging Face format and
registered in MLflow with its lineage; `gateway_llm_draft` is its draft model for speculative
decoding (smaller, the same tokenizer), trained by the same job."""

import shutil
from dataclasses import replace
from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSpec, AssetKey, Config, MaterializeResult, MetadataValue, asset

from assets.ingestion import warehouse_key
from assets.metadata import table
from assets.pipelines import code_version
from engines.models.llm_registry import LlmLineage, register_llm
from engines.retrieval.embeddings import current_catalogue
from feature_defs.sources import chat_messages, items
from ml.llm import DRAFT_CONFIG, LlmConfig, corpus_from_frames, train_llm
from resources.lake import LakeResource
from resources.registry import ModelRegistryResource

GATEWAY_LLM = AssetKey(["models", "gateway_llm"])
GATEWAY_LLM_DRAFT = AssetKey(["models", "gateway_llm_draft"])
REGISTERED_NAME = "gateway_llm"
DRAFT_REGISTERED_NAME = "gateway_llm_draft"


class GatewayLlmConfig(Config):
    steps: int = 200
    vocab_size: int = 1024
    context: int = 128
    promote: bool = True  # move the registry alias `champion` to the new version when its check passes


def gateway_llm_dir(lake_root: str | Path) -> Path:
    return Path(lake_root) / "models" / "gateway_llm"


def gateway_llm_draft_dir(lake_root: str | Path) -> Path:
    return Path(lake_root) / "models" / "gateway_llm_draft"


def corpus_partitions(lake) -> dict[str, list]:
    """The warehouse days the corpus reads (the model's data lineage)."""
    return {f"warehouse/{t}": lake.partition_days("warehouse", t) for t in (chat_messages.name, items.name)}


def lake_corpus(lake) -> list[str]:
    """Every chat message and item listing in the warehouse."""
    import polars as pl

    def frame(table: str) -> pl.DataFrame:
        days = lake.partition_days("warehouse", table)
        scan = lake.scan_partitions("warehouse", table, days)
        if scan is None:
            raise ValueError(f"warehouse/{table} has no partitions: ingest landing data first")
        return scan.collect()

    catalogue = current_catalogue(lake)
    if catalogue.is_empty():
        raise ValueError(f"warehouse/{items.name} has no partitions: ingest landing data first")
    chats = frame(chat_messages.name)
    return corpus_from_frames(chats["text"].to_list(), catalogue["title"].to_list(), catalogue["description"].to_list())


@asset(
    key=GATEWAY_LLM,
    group_name="models",
    description="A tiny Llama-architecture causal LM and its byte-level BPE tokenizer, trained on every chat "
    "message and item listing in the warehouse; saved in Hugging Face format for vLLM behind the "
    "ML gateway and registered in MLflow as `gateway_llm` (alias `challenger`, `champion` once it "
    "beats the unigram baseline).",
    deps=[warehouse_key(chat_messages), warehouse_key(items)],
    kinds={"pytorch", "huggingface", "mlflow"},
    owners=["team:ml-platform"],
    tags={"domain": "llm"},
    check_specs=[
        AssetCheckSpec(
            "beats_unigram_baseline",
            asset=GATEWAY_LLM,
            description="Held-out perplexity is below that of token frequencies alone",
        )
    ],
)
def gateway_llm(context, config: GatewayLlmConfig, lake: LakeResource, model_registry: ModelRegistryResource):
    source = lake.get_client()
    documents = lake_corpus(source)
    target = gateway_llm_dir(lake.root)
    metrics = train_into(
        target,
        lambda staging: train_llm(
            documents,
            staging,
            LlmConfig(steps=config.steps, vocab_size=config.vocab_size, context=config.context),
            log=context.log.info,
        ),
    )
    passed = metrics["held_out_perplexity"] < metrics["unigram_perplexity"]
    version = register_version(
        context,
        model_registry,
        REGISTERED_NAME,
        target,
        metrics,
        corpus_partitions(source),
        promote=config.promote and passed,
    )
    yield MaterializeResult(
        metadata={
            "path": str(target),
            "parameters": metrics["parameters"],
            "documents": metrics["documents"],
            "held_out_perplexity": metrics["held_out_perplexity"],
            "registered_version": MetadataValue.int(int(version.version)),
            "tokenizer_sha256": metrics["tokenizer_sha256"],
            "training": table([{k: v for k, v in metrics.items() if k != "config"}]),
        }
    )
    yield AssetCheckResult(
        check_name="beats_unigram_baseline",
        passed=passed,
        metadata={"perplexity": metrics["held_out_perplexity"], "unigram": metrics["unigram_perplexity"]},
    )


@asset(
    key=GATEWAY_LLM_DRAFT,
    group_name="models",
    description="The draft model for speculative decoding of gateway_llm: one layer, half the width, the same "
    "tokenizer, trained on the same corpus; registered as `gateway_llm_draft`.",
    deps=[GATEWAY_LLM],
    kinds={"pytorch", "huggingface", "mlflow"},
    owners=["team:ml-platform"],
    tags={"domain": "llm"},
    check_specs=[
        AssetCheckSpec(
            "draft_fits_target",
            asset=GATEWAY_LLM_DRAFT,
            description="Same tokenizer as the registered target, fewer parameters, and a "
            "held-out perplexity below the unigram baseline",
        )
    ],
)
def gateway_llm_draft(context, config: GatewayLlmConfig, lake: LakeResource, model_registry: ModelRegistryResource):
    source = lake.get_client()
    documents = lake_corpus(source)
    target_dir = gateway_llm_dir(lake.root)
    draft = gateway_llm_draft_dir(lake.root)
    target_metrics = json_metrics(target_dir)
    metrics = train_into(
        draft,
        lambda staging: train_llm(
            documents,
            staging,
            replace(DRAFT_CONFIG, steps=config.steps, context=config.context),
            log=context.log.info,
            tokenizer_dir=target_dir,
        ),
    )
    registry = model_registry.get_client()
    target_version = next(
        (
            v
            for v in reversed(registry.versions(REGISTERED_NAME))
            if v.tags.get("mlplane.tokenizer_sha256") == metrics["tokenizer_sha256"]
        ),
        None,
    )
    smaller = metrics["parameters"] < target_metrics["parameters"]
    passed = target_version is not None and smaller and metrics["held_out_perplexity"] < metrics["unigram_perplexity"]
    version = register_version(
        context,
        model_registry,
        DRAFT_REGISTERED_NAME,
        draft,
        metrics,
        corpus_partitions(source),
        promote=config.promote and passed,
        role="draft",
        draft_for=f"{REGISTERED_NAME}/{target_version.version}" if target_version else None,
    )
    yield MaterializeResult(
        metadata={
            "path": str(draft),
            "parameters": metrics["parameters"],
            "target_parameters": target_metrics["parameters"],
            "held_out_perplexity": metrics["held_out_perplexity"],
            "registered_version": MetadataValue.int(int(version.version)),
            "draft_for": f"{REGISTERED_NAME}/{target_version.version}" if target_version else "(no matching target)",
        }
    )
    yield AssetCheckResult(
        check_name="draft_fits_target",
        passed=passed,
        metadata={
            "same_tokenizer_as": f"v{target_version.version}" if target_version else "(none registered)",
            "parameters": metrics["parameters"],
            "target_parameters": target_metrics["parameters"],
            "perplexity": metrics["held_out_perplexity"],
            "unigram": metrics["unigram_perplexity"],
        },
    )


def json_metrics(model_dir: Path) -> dict:
    import json

    path = model_dir / "mlplane_training.json"
    if not path.exists():
        raise FileNotFoundError(f"{model_dir} has no trained model: materialize models/gateway_llm first")
    return json.loads(path.read_text())


def train_into(target: Path, train) -> dict:
    """Trains into a staging folder and swaps it in: the previous model stays until the new one is complete."""
    staging = target.with_name(f".{target.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    metrics = train(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return metrics


def register_version(
    context,
    model_registry: ModelRegistryResource,
    name: str,
    model_dir: Path,
    metrics: dict,
    partitions: dict,
    promote: bool,
    role: str = "target",
    draft_for: str | None = None,
    passed_because: str = "beats the unigram baseline",
):
    """A new registry version of `model_dir` with its lineage, alias `challenger`, and `champion` when
    `promote` (its check passed)."""
    registry = model_registry.get_client()
    who = f"dagster run {context.run.run_id}"
    lineage = LlmLineage(
        partitions,
        metrics["tokenizer_sha256"],
        code_version(),
        f"{who}, asset {context.asset_key.to_user_string()}",
        role,
        draft_for,
    )
    params = {k: str(v) for k, v in metrics["config"].items()}
    version = register_llm(
        registry,
        name,
        model_dir,
        lineage,
        {k: v for k, v in metrics.items() if k not in ("config", "tokenizer_sha256")},
        params,
    )
    registry.set_alias(name, "challenger", version.version, who=who, reason="trained")
    if promote:
        registry.set_alias(name, "champion", version.version, who=who, reason=passed_because)
    context.log.info(f"registered {name} v{version.version}{' as champion' if promote else ''}")
    return version
