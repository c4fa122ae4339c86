"""Models the platform trains itself. `gateway_llm` is the small language model the ML gateway's
vLLM backends serve: trained on the marketplace's own text, saved in Hugging Face format."""

import shutil
from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSpec, AssetKey, Config, MaterializeResult, asset

from assets.ingestion import warehouse_key
from assets.metadata import table
from engines.embeddings import current_catalogue
from feature_defs.sources import chat_messages, items
from ml.llm import LlmConfig, corpus_from_frames, train_llm
from resources.lake import LakeResource

GATEWAY_LLM = AssetKey(["models", "gateway_llm"])


class GatewayLlmConfig(Config):
    steps: int = 200
    vocab_size: int = 1024
    context: int = 128


def gateway_llm_dir(lake_root: str | Path) -> Path:
    return Path(lake_root) / "models" / "gateway_llm"


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
    return corpus_from_frames(chats["text"].to_list(), catalogue["title"].to_list(),
                              catalogue["description"].to_list())


@asset(
    key=GATEWAY_LLM,
    group_name="models",
    description="A tiny Llama-architecture causal LM and its byte-level BPE tokenizer, trained on every chat "
                "message and item listing in the warehouse; saved in Hugging Face format for vLLM behind the "
                "ML gateway.",
    deps=[warehouse_key(chat_messages), warehouse_key(items)],
    kinds={"pytorch", "huggingface"},
    owners=["team:ml-platform"],
    tags={"domain": "llm"},
    check_specs=[AssetCheckSpec("beats_unigram_baseline", asset=GATEWAY_LLM,
                                description="Held-out perplexity is below that of token frequencies alone")],
)
def gateway_llm(context, config: GatewayLlmConfig, lake: LakeResource):
    documents = lake_corpus(lake.lake())
    target = gateway_llm_dir(lake.root)
    staging = target.with_name(".gateway_llm.staging")
    shutil.rmtree(staging, ignore_errors=True)
    metrics = train_llm(documents, staging, LlmConfig(steps=config.steps, vocab_size=config.vocab_size,
                                                      context=config.context), log=context.log.info)
    shutil.rmtree(target, ignore_errors=True)  # the previous model stays until the new one is complete
    staging.rename(target)
    yield MaterializeResult(metadata={
        "path": str(target),
        "parameters": metrics["parameters"],
        "documents": metrics["documents"],
        "held_out_perplexity": metrics["held_out_perplexity"],
        "training": table([{k: v for k, v in metrics.items() if k != "config"}]),
    })
    yield AssetCheckResult(
        check_name="beats_unigram_baseline",
        passed=metrics["held_out_perplexity"] < metrics["unigram_perplexity"],
        metadata={"perplexity": metrics["held_out_perplexity"], "unigram": metrics["unigram_perplexity"]},
    )


llm_assets = [gateway_llm]
