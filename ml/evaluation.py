"""Held-out evaluation of the personalization model beside a popularity baseline: AUC of the scored
impressions, recall@k and NDCG@k of each user's ranking of the catalogue. Plain Python, no Dagster."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from ml.personalization import LABEL, PersonalizationModel, labelled, with_item_embeddings


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (rank statistic, ties counted half)."""
    labels = np.asarray(labels, dtype=bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs positive and negative rows")
    ranks = pl.Series(scores).rank("average").to_numpy()
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def ranking_metrics(ranked: dict[int, list[int]], relevant: dict[int, set[int]], k: int) -> dict[str, float]:
    """Mean recall@k and NDCG@k over the users with relevant items."""
    recalls, ndcgs = [], []
    for user, items in relevant.items():
        top = ranked.get(user, [])[:k]
        hits = [1.0 if i in items else 0.0 for i in top]
        recalls.append(sum(hits) / len(items))
        ideal = sum(1 / math.log2(r + 2) for r in range(min(len(items), k)))
        ndcgs.append(sum(h / math.log2(r + 2) for r, h in enumerate(hits)) / ideal)
    return {f"recall@{k}": float(np.mean(recalls)), f"ndcg@{k}": float(np.mean(ndcgs))}


def popularity(train_frame: pl.DataFrame) -> dict[int, float]:
    """The baseline: each item's positives in the training rows."""
    counts = labelled(train_frame).group_by("item_id").agg(pl.col(LABEL).sum())
    return dict(zip(counts.get_column("item_id").to_list(), counts.get_column(LABEL).to_list()))


def evaluate(
    model: PersonalizationModel,
    train_frame: pl.DataFrame,
    held_out: pl.DataFrame,
    k: int = 10,
    item_embeddings: pl.DataFrame | None = None,
) -> dict[str, dict[str, float]]:
    """AUC on held-out impressions; recall@k and NDCG@k of ranking every item seen in training for
    each held-out user with a positive; the same for the popularity baseline."""
    rows = labelled(with_item_embeddings(held_out, item_embeddings))
    labels = rows.get_column(LABEL).to_numpy() > 0
    popular = popularity(train_frame)
    baseline_scores = np.array([popular.get(i, 0.0) for i in rows.get_column("item_id").to_list()])

    # every candidate item with its latest known features; every user with theirs
    item_columns = [c for c in model.spec.item.columns if c != model.spec.item.embedding_column]
    items = with_item_embeddings(
        pl.concat([train_frame, held_out], how="diagonal_relaxed")
        .sort("event_timestamp")
        .select(item_columns)
        .unique("item_id", keep="last")
        .sort("item_id"),
        item_embeddings,
    )
    user_columns = model.spec.user.columns
    users = rows.sort("event_timestamp").select(user_columns).unique("user_id", keep="first").sort("user_id")
    scores = model.user_vectors(users) @ model.item_vectors(items).T
    item_ids = np.array(items.get_column("item_id").to_list())
    user_ids = users.get_column("user_id").to_list()
    ranked = {u: item_ids[np.argsort(-scores[i], kind="stable")[:k]].tolist() for i, u in enumerate(user_ids)}
    popular_order = sorted(item_ids.tolist(), key=lambda i: -popular.get(i, 0.0))[:k]
    positives = rows.filter(pl.col(LABEL) > 0).group_by("user_id").agg(pl.col("item_id").unique())
    relevant = {u: set(i) for u, i in positives.iter_rows()}
    return {
        "model": {"auc": auc(labels, model.score(rows)), **ranking_metrics(ranked, relevant, k)},
        "popularity": {
            "auc": auc(labels, baseline_scores),
            **ranking_metrics({u: popular_order for u in relevant}, relevant, k),
        },
    }


def split_held_out(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Train on every day but the newest; hold the newest out."""
    days = frame.get_column("event_timestamp").dt.date()
    newest = days.max()
    if days.n_unique() < 2:
        raise ValueError(f"need at least two days of training data to hold one out, got only {newest}")
    return frame.filter(days < newest), frame.filter(days == newest)
