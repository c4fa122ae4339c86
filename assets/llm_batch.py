"""Batch LLM inference as a daily asset: a short description, written by the gateway's LLM, for each of
the day's new or changed items whose description is empty. Thin: the engine is engines/models/llm_batch.py."""

from typing import Literal

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetKey,
    BackfillPolicy,
    Backoff,
    Config,
    MaterializeResult,
    MetadataValue,
    RetryPolicy,
    asset,
)

from assets.ingestion import warehouse_key
from assets.metadata import table
from assets.partitions import daily_partitions, partition_days
from engines.models.llm_batch import BatchRun, BatchSpec, describe_items, describe_items_ray_vllm, descriptions_frame
from engines.models.llm_batch import RetryPolicy as CallRetry
from feature_defs.sources import items
from resources.gateway import GatewayResource
from resources.lake import LakeResource

ITEM_DESCRIPTIONS = AssetKey(["llm", "item_descriptions"])
ZONE, TABLE = "llm", "item_descriptions"


class ItemDescriptionsConfig(Config):
    model: str = "gateway-llm"
    max_tokens: int = 48
    min_tokens: int = 8
    concurrency: int = 4
    max_attempts: int = 6  # per item; 429 and 503 answers are retried after their Retry-After
    max_delay_s: float = 30.0
    engine: Literal["gateway", "ray_vllm"] = "gateway"
    model_dir: str | None = None  # ray_vllm: the model folder every Ray worker can read
    ray_replicas: int = 1
    ray_gpus_per_replica: float = 1.0


def items_without_description(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per item (its newest version of the day) whose description is missing or blank."""
    newest = frame.sort("updated_at").unique("item_id", keep="last")
    blank = pl.col("description").is_null() | (pl.col("description").str.strip_chars() == "")
    return newest.filter(blank).sort("item_id")


@asset(
    key=ITEM_DESCRIPTIONS,
    group_name="llm",
    description="Daily: a short description written by the gateway LLM for each of the day's new or changed items "
    "whose description is empty, called through the ML gateway with a service key (its limits and "
    "usage apply); 429s retried after Retry-After. Engine `ray_vllm` runs vLLM's offline batch API "
    "on Ray instead (production, GPU workers).",
    deps=[warehouse_key(items)],
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    retry_policy=RetryPolicy(max_retries=2, delay=30, backoff=Backoff.EXPONENTIAL),
    kinds={"vllm", "polars"},
    owners=["team:ml-platform"],
    tags={"domain": "llm"},
    check_specs=[
        AssetCheckSpec(
            "every_blank_item_described",
            asset=ITEM_DESCRIPTIONS,
            description="Each item of the day with an empty description has exactly one row, "
            "with a non-empty description and no error",
        )
    ],
)
def item_descriptions(context, config: ItemDescriptionsConfig, lake: LakeResource, gateway: GatewayResource):
    source = lake.get_client()
    spec = BatchSpec(
        config.model,
        config.max_tokens,
        config.min_tokens,
        0.0,
        config.concurrency,
        CallRetry(config.max_attempts, 0.5, config.max_delay_s),
    )
    summary, problems = [], []
    for day in partition_days(context):
        wanted = items_without_description(source.read_partition("warehouse", items.name, day))
        rows = wanted.select("item_id", "title", "category").to_dicts()
        run = describe(rows, config, spec, gateway)
        frame = descriptions_frame(run, rows, config.model)
        source.write_partition(ZONE, TABLE, day, frame)
        summary.append(
            {
                "day": day.isoformat(),
                **run.totals(),
                "seconds": round(run.seconds, 2),
                "items_per_s": round(run.items_per_s, 3),
            }
        )
        problems += check_day(day, wanted, frame)
    totals = {
        k: sum(s[k] for s in summary)
        for k in ("items", "generated", "failed", "prompt_tokens", "completion_tokens", "rate_limited_retries")
    }
    seconds = sum(s["seconds"] for s in summary)
    yield MaterializeResult(
        metadata={
            **{k: MetadataValue.int(v) for k, v in totals.items()},
            "items_per_s": MetadataValue.float(totals["items"] / seconds if seconds else 0.0),
            "engine": config.engine,
            "model": config.model,
            "days": table(summary),
        }
    )
    yield AssetCheckResult(
        check_name="every_blank_item_described",
        passed=not problems,
        metadata={"problems": MetadataValue.json(problems[:50]), "count": len(problems)},
    )


def describe(rows: list[dict], config: ItemDescriptionsConfig, spec: BatchSpec, gateway: GatewayResource) -> BatchRun:
    """Describe the items with the configured engine: the gateway, or vLLM's offline batch API on Ray."""
    if config.engine != "ray_vllm":
        return describe_items(rows, gateway.call, spec)
    if not config.model_dir:
        raise ValueError("engine ray_vllm needs model_dir (a model folder every Ray worker can read)")
    return describe_items_ray_vllm(rows, config.model_dir, spec, config.ray_replicas, config.ray_gpus_per_replica)


def check_day(day, wanted: pl.DataFrame, written: pl.DataFrame) -> list[str]:
    problems = []
    expected, got = set(wanted["item_id"].to_list()), written["item_id"].to_list()
    if set(got) != expected or len(got) != len(set(got)):
        problems.append(f"{day}: rows for {sorted(set(got))[:20]}, expected {sorted(expected)[:20]}")
    for row in written.filter(pl.col("error").is_not_null() | (pl.col("description").fill_null("") == "")).to_dicts():
        problems.append(f"{day}: item {row['item_id']}: {row['error'] or 'empty description'}")
    return problems


llm_batch_assets = [item_descriptions]
