"""Daily batch recommendations: the champion two-tower model's item vectors go into the vector
database; a Ray Data pipeline turns every active user's features into a user vector and retrieves
that user's top-k items from the vector database inside the same task (a Qdrant server by URL, or a
read-only copy of the embedded index in each worker process). Plain Python, no Dagster.

The vector store ranks by cosine; the model scores by inner product. Item vectors get one extra
coordinate that brings every item to the same norm and queries get 0 there, so cosine order equals
inner-product order and the exact inner product is cosine x |query| x that norm.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl

from engines.data.lake import Lake
from engines.features.point_in_time import LIVE_TIMING, AsOfResult, Timing, features_as_of
from engines.models.ray_objects import Shipped, block_rows, blocks_dataset, cached
from engines.retrieval.vector_store import Replica, VectorStore
from feature_defs.compile.polars import POLARS_TYPES, TIMESTAMP, day_end
from ml.personalization import PersonalizationModel

VECTOR_NAME = "tower"
ZONE = "inference"
TABLE = "personalization_recommendations"
RECOMMENDATION_SCHEMA = {"user_id": pl.Int64, "rank": pl.Int32, "item_id": pl.Int64, "score": pl.Float64}


def collection_name(model_version: str) -> str:
    return f"personalization_items_v{model_version}"


# --- inputs from the lake ------------------------------------------------------------------------
def active_users(lake: Lake, day: date) -> list[int]:
    """Users with any interaction on the day."""
    frame = lake.read_partition("warehouse", "interactions", day)
    return sorted(frame.get_column("user_id").unique().to_list())


def existing_items(lake: Lake, day: date) -> set[int]:
    """Every item in the items dimension as of the day."""
    days = [d for d in lake.partition_days("warehouse", "items") if d <= day]
    if not days:
        raise FileNotFoundError(f"no warehouse/items partition on or before {day}")
    return set(
        lake.scan_partitions("warehouse", "items", days)
        .select("item_id")
        .unique()
        .collect()
        .get_column("item_id")
        .to_list()
    )


def entity_features(
    lake: Lake, day: date, columns: list[str], key: str, entities: list[int], timing: Timing = LIVE_TIMING
) -> AsOfResult:
    """The features among `columns` (`<view>__<feature>`) of every entity as of the end of `day`: what
    the online store holds once the day's run has loaded it (engines.features.point_in_time). The frame has
    `key`, `event_timestamp` and the features, one row per entity; a dimension view is the catalogue
    as known then, never the day's change set alone."""
    frame = pl.DataFrame({key: entities}, schema={key: pl.Int64}).with_columns(
        pl.lit(day_end(day)).cast(POLARS_TYPES["timestamp"]).alias(TIMESTAMP)
    )
    return features_as_of(lake.root, [c for c in columns if "__" in c], frame, timing)


# --- the vector database --------------------------------------------------------------------------
def index_items(store: VectorStore, model: PersonalizationModel, items: pl.DataFrame, version: str) -> int:
    """Upsert every item's vector (made cosine-ready) and delete points of items that are gone."""
    name = collection_name(version)
    vectors = model.item_vectors(items)
    norms = np.linalg.norm(vectors, axis=1)
    radius = float(norms.max()) if len(norms) else 1.0
    padded = np.hstack([vectors, np.sqrt(np.maximum(radius**2 - norms**2, 0.0))[:, None]])
    store.ensure_collection(name, {VECTOR_NAME: padded.shape[1]})
    ids = [str(i) for i in items.get_column("item_id").to_list()]
    store.upsert(name, ids, {VECTOR_NAME: padded}, [{"item_id": int(i)} for i in ids])
    gone = sorted(set(store.ids(name)) - set(ids))
    store.delete(name, gone)
    return radius


def retrieve(
    store: VectorStore, name: str, radius: float, user_ids: list[int], vectors: np.ndarray, k: int
) -> pl.DataFrame:
    """Top-k items for each user vector (rows of `vectors`) from the vector database, one batch query."""
    vectors = np.asarray(vectors, dtype=np.float32).reshape(len(user_ids), -1)
    queries = np.hstack([vectors, np.zeros((len(user_ids), 1), np.float32)])
    norms = np.linalg.norm(queries, axis=1)
    rows: dict[str, list] = {"user_id": [], "rank": [], "item_id": [], "score": []}
    hits_per_user = store.search_batch(name, queries, VECTOR_NAME, k) if len(user_ids) else []
    for user_id, norm, hits in zip(user_ids, norms.tolist(), hits_per_user):
        for rank, hit in enumerate(hits, start=1):
            rows["user_id"].append(user_id)
            rows["rank"].append(rank)
            rows["item_id"].append(int(hit.payload["item_id"]))
            rows["score"].append(hit.score * (norm or 1.0) * radius)
    return pl.DataFrame(rows, schema=RECOMMENDATION_SCHEMA)


# --- recommendations: Ray Data or one process -------------------------------------------------------
def recommend_block(
    users: pl.DataFrame, model: PersonalizationModel, store: VectorStore, name: str, radius: float, k: int
) -> pl.DataFrame:
    """User vectors of a block of feature rows, then their top-k from the vector database."""
    return retrieve(store, name, radius, users.get_column("user_id").to_list(), model.user_vectors(users), k)


def _recommend_task(
    batch, model: Shipped, index: Shipped, name: str, radius: float, k: int, fail_once_marker: str | None
):
    """Ray Data task: this worker process's model and read-only copy of the vector index (fetched
    through the object store on its first block), then `recommend_block`. `fail_once_marker`
    injects one worker crash (tests): the first task to find no marker file writes it and dies
    mid-block; Ray starts another worker and re-runs the block."""
    import torch

    if fail_once_marker and not os.path.exists(fail_once_marker):
        Path(fail_once_marker).write_text(str(os.getpid()))
        os._exit(1)
    torch.set_num_threads(1)
    tower = cached("personalization-model", model, lambda m: m)
    store = cached("personalization-index", index, _open_replica, _close_replica)
    return recommend_block(pl.from_arrow(batch), tower, store, name, radius, k).to_arrow()


def _open_replica(replica: Replica) -> VectorStore:
    return replica.open(tempfile.mkdtemp(prefix="mlplane-index-"))


def _close_replica(store: VectorStore) -> None:
    store.close()
    if not store.location.startswith(("http://", "https://")):
        shutil.rmtree(store.location, ignore_errors=True)


def recommend_ray(
    users: pl.DataFrame,
    store: VectorStore,
    model: PersonalizationModel,
    name: str,
    radius: float,
    k: int,
    workers: int | None,
    batch_size: int,
    fail_once_marker: str | None = None,
) -> Iterator[pl.DataFrame]:
    """Recommendations computed by Ray Data tasks, one per CPU (at most `workers` at once), each with
    the model and the vector index shipped through the object store: a Qdrant server's URL, or a
    copy of the embedded index's points (Ray must be started)."""
    import ray.data

    table = users.to_arrow()
    rows = block_rows(table.num_rows, batch_size, at_least=min(batch_size, 256))
    shipped_model, index = Shipped.put(model), Shipped.put(store.replica(name))
    out = blocks_dataset(table, rows).map_batches(
        _recommend_task,
        batch_size=None,
        batch_format="pyarrow",
        num_cpus=1,
        fn_kwargs={
            "model": shipped_model,
            "index": index,
            "name": name,
            "radius": radius,
            "k": k,
            "fail_once_marker": fail_once_marker,
        },
        compute=ray.data.TaskPoolStrategy(size=workers),
        # a crashed worker's block is re-run; outputs of a failed attempt are dropped
        max_retries=3,
        retry_exceptions=True,
    )
    for batch in out.iter_batches(batch_format="pyarrow", batch_size=None):
        yield pl.from_arrow(batch)


def recommend_local(
    users: pl.DataFrame,
    store: VectorStore,
    model: PersonalizationModel,
    name: str,
    radius: float,
    k: int,
    batch_size: int,
) -> Iterator[pl.DataFrame]:
    """The same recommendations in this process, block by block (the baseline of the benchmark)."""
    for start in range(0, users.height, batch_size):
        yield recommend_block(users.slice(start, batch_size), model, store, name, radius, k)


@dataclass
class BatchResult:
    recommendations: pl.DataFrame
    active_users: int
    missing_users: list[int]
    duplicate_users: list[int]
    unknown_items: list[int]


def recommend(
    users: pl.DataFrame,
    store: VectorStore,
    model: PersonalizationModel,
    version: str,
    radius: float,
    k: int,
    engine: str = "ray",
    workers: int | None = None,
    batch_size: int = 4096,
    fail_once_marker: str | None = None,
) -> pl.DataFrame:
    """Top-k recommendations for every row of `users` (user feature rows)."""
    name = collection_name(version)
    if engine == "ray":
        parts = list(recommend_ray(users, store, model, name, radius, k, workers, batch_size, fail_once_marker))
    elif engine == "local":
        parts = list(recommend_local(users, store, model, name, radius, k, batch_size))
    else:
        raise ValueError(f"engine must be 'ray' or 'local', not {engine!r}")
    return pl.concat(parts) if parts else pl.DataFrame(schema=RECOMMENDATION_SCHEMA)


def online_rows(recommendations: pl.DataFrame, day: date) -> pl.DataFrame:
    """One row per user for the online store: item ids and scores best first, stamped like the day's
    feature rows (midnight after the day)."""
    return (
        recommendations.sort("user_id", "rank")
        .group_by("user_id", maintain_order=True)
        .agg(pl.col("item_id").alias("item_ids"), pl.col("score").alias("scores"), pl.col("model_version").first())
        .with_columns(pl.lit(day_end(day)).cast(POLARS_TYPES["timestamp"]).alias(TIMESTAMP))
    )


def coverage(recommendations: pl.DataFrame, active: list[int], items: set[int]) -> BatchResult:
    """Which active users got no list or more than one, and which recommended items do not exist."""
    per_user = recommendations.group_by("user_id").agg((pl.col("rank") == 1).sum().alias("lists"))
    covered = set(per_user.get_column("user_id").to_list())
    duplicates = sorted(per_user.filter(pl.col("lists") != 1).get_column("user_id").to_list())
    unknown = sorted(set(recommendations.get_column("item_id").unique().to_list()) - items)
    return BatchResult(recommendations, len(active), sorted(set(active) - covered), duplicates, unknown)


def score_drift(today: pl.Series, yesterday: pl.Series, bins: int = 10) -> float:
    """Population stability index of today's scores against yesterday's (quantile bins of yesterday)."""
    if today.is_empty() or yesterday.is_empty():
        raise ValueError("score drift needs scores on both days")
    edges = np.unique(np.quantile(yesterday.to_numpy(), np.linspace(0, 1, bins + 1)[1:-1]))
    expected = np.bincount(np.searchsorted(edges, yesterday.to_numpy()), minlength=len(edges) + 1) / len(yesterday)
    actual = np.bincount(np.searchsorted(edges, today.to_numpy()), minlength=len(edges) + 1) / len(today)
    expected, actual = np.clip(expected, 1e-4, None), np.clip(actual, 1e-4, None)
    return float(np.sum((actual - expected) * np.log(actual / expected)))
