"""Held-out evaluation of the personalization model beside two baselines, popularity and the taste-cluster
mixture (ml.taste_clusters): AUC of the scored impressions, recall@k and NDCG@k of each user's ranking of
the catalogue (agreement with human relevance labels: engines/models/human_relevance.py). Plain Python, no
Dagster."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from ml import taste_clusters
from ml.comparison import Comparison, delong, paired_bootstrap
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
    recalls, ndcgs = per_user_ranking(ranked, relevant, k)
    return {f"recall@{k}": float(np.mean(recalls)), f"ndcg@{k}": float(np.mean(ndcgs))}


def per_user_ranking(
    ranked: dict[int, list[int]], relevant: dict[int, set[int]], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Recall@k and NDCG@k of each user of `relevant`, in its order."""
    recalls, ndcgs = [], []
    for user, items in relevant.items():
        top = ranked.get(user, [])[:k]
        hits = [1.0 if i in items else 0.0 for i in top]
        recalls.append(sum(hits) / len(items))
        ideal = sum(1 / math.log2(r + 2) for r in range(min(len(items), k)))
        ndcgs.append(sum(h / math.log2(r + 2) for r, h in enumerate(hits)) / ideal)
    return np.array(recalls), np.array(ndcgs)


def popularity(train_frame: pl.DataFrame) -> dict[int, float]:
    """The baseline: each item's positives in the training rows."""
    counts = labelled(train_frame).group_by("item_id").agg(pl.col(LABEL).sum())
    return dict(zip(counts.get_column("item_id").to_list(), counts.get_column(LABEL).to_list()))


@dataclass(frozen=True)
class HeldOutScores:
    """One model on the held-out data, row by row, for paired comparisons with another on the same rows."""

    labels: np.ndarray  # per held-out impression
    scores: np.ndarray  # the model's score of each impression
    users: np.ndarray  # the held-out users with a positive, in a fixed order
    recall: np.ndarray  # recall@k of each of those users' ranking of the catalogue
    ndcg: np.ndarray
    k: int

    def metrics(self) -> dict[str, float]:
        return {
            "auc": auc(self.labels, self.scores),
            f"recall@{self.k}": float(np.mean(self.recall)),
            f"ndcg@{self.k}": float(np.mean(self.ndcg)),
        }


def held_out_scores(
    model: PersonalizationModel,
    train_frame: pl.DataFrame,
    held_out: pl.DataFrame,
    k: int = 10,
    item_embeddings: pl.DataFrame | None = None,
) -> HeldOutScores:
    """The model's scores of the held-out impressions and, for each held-out user with a positive, the
    recall@k and NDCG@k of its ranking of every item seen in training."""
    rows = labelled(with_item_embeddings(held_out, item_embeddings))
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
    relevant = relevant_items(rows)
    recall, ndcg = per_user_ranking(ranked, relevant, k)
    labels = rows.get_column(LABEL).to_numpy() > 0
    return HeldOutScores(labels, model.score(rows), np.array(list(relevant)), recall, ndcg, k)


def relevant_items(rows: pl.DataFrame) -> dict[int, set[int]]:
    """Each user's positive items among labelled rows, users in ascending order."""
    positives = rows.filter(pl.col(LABEL) > 0).group_by("user_id").agg(pl.col("item_id").unique()).sort("user_id")
    return {u: set(i) for u, i in positives.iter_rows()}


def evaluate(
    model: PersonalizationModel,
    train_frame: pl.DataFrame,
    held_out: pl.DataFrame,
    k: int = 10,
    item_embeddings: pl.DataFrame | None = None,
) -> dict[str, dict[str, float]]:
    """AUC on held-out impressions; recall@k and NDCG@k of ranking every item seen in training for
    each held-out user with a positive; the same for the popularity and taste-cluster baselines."""
    mine = held_out_scores(model, train_frame, held_out, k, item_embeddings)
    rows = labelled(with_item_embeddings(held_out, item_embeddings))  # the rows `mine` scored, in its order
    popular = popularity(train_frame)
    baseline_scores = np.array([popular.get(i, 0.0) for i in rows.get_column("item_id").to_list()])
    catalogue = pl.concat([train_frame, held_out], how="diagonal_relaxed").get_column("item_id").unique().to_list()
    popular_order = sorted(sorted(catalogue), key=lambda i: -popular.get(i, 0.0))[:k]
    relevant = relevant_items(rows)
    return {
        "model": mine.metrics(),
        "popularity": {
            "auc": auc(mine.labels, baseline_scores),
            **ranking_metrics({u: popular_order for u in relevant}, relevant, k),
        },
        "taste_clusters": taste_cluster_metrics(train_frame, held_out, k),
    }


def taste_cluster_metrics(train_frame: pl.DataFrame, held_out: pl.DataFrame, k: int = 10) -> dict[str, float]:
    """The taste-cluster mixture's AUC, recall@k and NDCG@k on the held-out day (taste_cluster_scores)."""
    return taste_cluster_scores(train_frame, held_out, k).metrics()


def taste_cluster_scores(train_frame: pl.DataFrame, held_out: pl.DataFrame, k: int = 10) -> HeldOutScores:
    """The taste-cluster mixture fitted on the training rows, on the held-out day, row by row: its scores of
    the impressions and each held-out user's recall@k and NDCG@k of its ranking of every item in the rows,
    on the rows and users `held_out_scores` uses (a paired comparison with the model needs the same).
    Items' categories come from both (a fixed attribute, known as of each row)."""
    every = pl.concat([train_frame, held_out], how="diagonal_relaxed")
    mixture = taste_clusters.fit(labelled(train_frame), LABEL, taste_clusters.item_categories(every))
    rows = labelled(held_out)
    scores = mixture.scores(rows.get_column("user_id").to_numpy(), rows.get_column("item_id").to_numpy())
    relevant = relevant_items(rows)
    catalogue = np.array(sorted(every.get_column("item_id").unique().to_list()))
    recall, ndcg = per_user_ranking(mixture.rank(list(relevant), catalogue, k), relevant, k)
    return HeldOutScores(rows.get_column(LABEL).to_numpy() > 0, scores, np.array(list(relevant)), recall, ndcg, k)


def paired_comparisons(champion: HeldOutScores, challenger: HeldOutScores) -> dict[str, Comparison]:
    """The challenger against the champion on the same held-out rows (ml.comparison): AUC with DeLong,
    recall@k and NDCG@k with the paired bootstrap over users."""
    if not (np.array_equal(champion.labels, challenger.labels) and np.array_equal(champion.users, challenger.users)):
        raise ValueError("the two models were scored on different held-out rows: a paired comparison needs the same")
    k = challenger.k
    return {
        "auc": delong(challenger.labels, champion.scores, challenger.scores),
        f"recall@{k}": paired_bootstrap(champion.recall, challenger.recall, users=challenger.users),
        f"ndcg@{k}": paired_bootstrap(champion.ndcg, challenger.ndcg, users=challenger.users),
    }


def split_held_out(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Train on every day but the newest; hold the newest out."""
    days = frame.get_column("event_timestamp").dt.date()
    newest = days.dt.max()
    if days.n_unique() < 2:
        raise ValueError(f"need at least two days of training data to hold one out, got only {newest}")
    return frame.filter(days < newest), frame.filter(days == newest)
