"""Daily batch recommendations: the champion two-tower model's item vectors go into the vector
database; a Ray Data pipeline turns every active user's features into a user vector and retrieves
that user's top-k items from the vector database. Plain Python, no Dagster.

The vector store ranks by cosine; the model scores by inner product. Item vectors get one extra
coordinate that brings every item to the same norm and queries get 0 there, so cosine order equals
inner-product order and the exact inner product is cosine x |query| x that norm.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl

from engines.lake import Lake
from engines.point_in_time import LIVE_TIMING, AsOfResult, Timing, features_as_of
from engines.vector_store import VectorStore
from feature_defs.compile.polars import POLARS_TYPES, TIMESTAMP, day_end
from ml.personalization import PersonalizationModel

VECTOR_NAME = "tower"
ZONE = "inference"
TABLE = "personalization_recommendations"


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
    return set(lake.scan_partitions("warehouse", "items", days).select("item_id").unique().collect()
               .get_column("item_id").to_list())


def entity_features(lake: Lake, day: date, columns: list[str], key: str, entities: list[int],
                    timing: Timing = LIVE_TIMING) -> AsOfResult:
    """The features among `columns` (`<view>__<feature>`) of every entity as of the end of `day`: what
    the online store holds once the day's run has loaded it (engines.point_in_time). The frame has
    `key`, `event_timestamp` and the features, one row per entity; a dimension view is the catalogue
    as known then, never the day's change set alone."""
    frame = pl.DataFrame({key: entities}, schema={key: pl.Int64}).with_columns(
        pl.lit(day_end(day)).cast(POLARS_TYPES["timestamp"]).alias(TIMESTAMP))
    return features_as_of(lake.root, [c for c in columns if "__" in c], frame, timing)


# --- the vector database --------------------------------------------------------------------------
def index_items(store: VectorStore, model: PersonalizationModel, items: pl.DataFrame, version: str) -> int:
    """Upsert every item's vector (made cosine-ready) and delete points of items that are gone."""
    name = collection_name(version)
    vectors = model.item_vectors(items)
    norms = np.linalg.norm(vectors, axis=1)
    radius = float(norms.max()) if len(norms) else 1.0
    padded = np.hstack([vectors, np.sqrt(np.maximum(radius ** 2 - norms ** 2, 0.0))[:, None]])
    store.ensure_collection(name, {VECTOR_NAME: padded.shape[1]})
    ids = [str(i) for i in items.get_column("item_id").to_list()]
    store.upsert(name, ids, {VECTOR_NAME: padded}, [{"item_id": int(i)} for i in ids])
    gone = sorted(set(store.ids(name)) - set(ids))
    store.delete(name, gone)
    return radius


def retrieve(store: VectorStore, name: str, radius: float, users: pl.DataFrame, k: int) -> pl.DataFrame:
    """Top-k items per user vector (`user_id`, `vector`) from the vector database."""
    rows: dict[str, list] = {"user_id": [], "rank": [], "item_id": [], "score": []}
    for user_id, vector in zip(users.get_column("user_id").to_list(), users.get_column("vector").to_list()):
        query = np.append(np.asarray(vector, dtype=np.float32), 0.0)
        norm = float(np.linalg.norm(query)) or 1.0
        for rank, hit in enumerate(store.search(name, query, VECTOR_NAME, k), start=1):
            rows["user_id"].append(user_id)
            rows["rank"].append(rank)
            rows["item_id"].append(int(hit.payload["item_id"]))
            rows["score"].append(hit.score * norm * radius)
    return pl.DataFrame(rows, schema={"user_id": pl.Int64, "rank": pl.Int32, "item_id": pl.Int64,
                                      "score": pl.Float64})


# --- user vectors: Ray Data or one process ---------------------------------------------------------
class UserTower:
    """Ray Data callable: a batch of user feature rows -> (user_id, vector). The model travels with the
    actor through Ray's object store, so actors on any node of a cluster have it.
    `fail_once_marker` injects one worker crash (tests): the first actor to find no marker file writes
    it and dies mid-batch; Ray restarts the actor and retries the batch."""

    def __init__(self, model: PersonalizationModel, fail_once_marker: str | None = None):
        import torch

        torch.set_num_threads(1)
        self.model = model
        self.fail_once_marker = fail_once_marker

    def __call__(self, batch):
        import pyarrow as pa

        if self.fail_once_marker and not os.path.exists(self.fail_once_marker):
            Path(self.fail_once_marker).write_text(str(os.getpid()))
            os._exit(1)
        frame = pl.from_arrow(batch)
        vectors = self.model.user_vectors(frame)
        return pa.table({"user_id": frame.get_column("user_id").to_arrow(),
                         "vector": pa.array(vectors.tolist(), type=pa.list_(pa.float32()))})


def user_vectors_ray(users: pl.DataFrame, model: PersonalizationModel, workers: int, batch_size: int,
                     fail_once_marker: str | None = None) -> Iterator[pl.DataFrame]:
    """User vectors computed on Ray Data by a pool of `workers` actors (Ray must be started)."""
    import ray.data

    table = users.to_arrow()
    blocks = [table.slice(start, batch_size) for start in range(0, max(len(table), 1), batch_size)]
    dataset = ray.data.from_arrow(blocks)
    vectors = dataset.map_batches(
        UserTower,
        fn_constructor_kwargs={"model": model, "fail_once_marker": fail_once_marker},
        batch_size=batch_size, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=workers), num_cpus=1,
        # a crashed worker is restarted and its batch re-run; outputs of a failed attempt are dropped
        max_restarts=3, max_task_retries=3,
    )
    for batch in vectors.iter_batches(batch_format="pyarrow", batch_size=None):
        yield pl.from_arrow(batch)


def user_vectors_local(users: pl.DataFrame, model: PersonalizationModel, batch_size: int
                       ) -> Iterator[pl.DataFrame]:
    """The same user vectors in this process, batch by batch (the baseline of the benchmark)."""
    tower = UserTower(model)
    for start in range(0, users.height, batch_size):
        yield pl.from_arrow(tower(users.slice(start, batch_size).to_arrow()))


@dataclass
class BatchResult:
    recommendations: pl.DataFrame
    active_users: int
    missing_users: list[int]
    duplicate_users: list[int]
    unknown_items: list[int]


def recommend(users: pl.DataFrame, store: VectorStore, model: PersonalizationModel, version: str, radius: float,
              k: int, engine: str = "ray", workers: int = 1, batch_size: int = 256,
              fail_once_marker: str | None = None) -> pl.DataFrame:
    """Top-k recommendations for every row of `users` (user feature rows)."""
    if engine == "ray":
        batches = user_vectors_ray(users, model, workers, batch_size, fail_once_marker)
    elif engine == "local":
        batches = user_vectors_local(users, model, batch_size)
    else:
        raise ValueError(f"engine must be 'ray' or 'local', not {engine!r}")
    name = collection_name(version)
    parts = [retrieve(store, name, radius, batch, k) for batch in batches]
    return pl.concat(parts) if parts else retrieve(store, name, radius, users.head(0).with_columns(
        pl.lit(None, pl.List(pl.Float32)).alias("vector")), k)


def online_rows(recommendations: pl.DataFrame, day: date) -> pl.DataFrame:
    """One row per user for the online store: item ids and scores best first, stamped like the day's
    feature rows (midnight after the day)."""
    return (recommendations.sort("user_id", "rank")
            .group_by("user_id", maintain_order=True)
            .agg(pl.col("item_id").alias("item_ids"), pl.col("score").alias("scores"),
                 pl.col("model_version").first())
            .with_columns(pl.lit(day_end(day)).cast(POLARS_TYPES["timestamp"]).alias(TIMESTAMP)))


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
