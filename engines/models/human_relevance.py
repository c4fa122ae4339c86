"""The personalization model against human judgement: the labelled (user, item) pairs of the newest
`recommendation_relevance` release (engines.data.releases), scored by the model and by popularity with the
newest features of each pair's user and item, and their AUC against the labels. Engines read releases and
call the model code; the model code (ml/) knows nothing of releases."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from engines.data.releases import NO_RELEASE, RELEVANCE_SCHEMA, RelevanceLabels, human_relevance_metrics
from ml.evaluation import popularity
from ml.personalization import PersonalizationModel, with_item_embeddings

Scorer = Callable[[pl.DataFrame], np.ndarray]  # scores of (user, item) rows, higher: more relevant


def labelled_pair_rows(
    every: pl.DataFrame,
    pairs: pl.DataFrame,
    user_columns: list[str],
    item_columns: list[str],
    item_embeddings: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The labelled (user_id, item_id) `pairs` as rows a model scores: each with its user's newest features
    and its item's newest features in `every` (a human judged the pair, not one impression of it). Pairs whose
    user or item `every` does not hold are left out: the model knows nothing to score them by."""
    ordered = every.sort("event_timestamp")
    users = ordered.select(list(dict.fromkeys(["user_id", *user_columns]))).unique("user_id", keep="last")
    item_only = [c for c in item_columns if c not in users.columns and c != "item_embedding"]
    items = ordered.select(list(dict.fromkeys(["item_id", *item_only]))).unique("item_id", keep="last")
    rows = pairs.select("user_id", "item_id").join(users, on="user_id").join(items, on="item_id")
    return with_item_embeddings(rows.sort("user_id", "item_id"), item_embeddings)


def human_relevance(scorers: dict[str, Scorer], rows: pl.DataFrame, labels: RelevanceLabels | None) -> dict[str, dict]:
    """Each scorer's agreement with the human relevance labels on the labelled pairs `rows`
    (labelled_pair_rows): engines.data.releases.human_relevance_metrics (the release, the scored pairs, how many
    are relevant, the AUC) with how many pairs the release labels. Before the first release every value
    says "no release"; where no AUC can be counted (no pair scored, one kind of label only), it says why."""
    if labels is None:
        nothing = {"release": NO_RELEASE, "labelled": 0, "pairs": 0, "relevant": 0, "auc": NO_RELEASE}
        return {name: dict(nothing) for name in scorers}
    found = {}
    for name, scorer in scorers.items():
        metrics = human_relevance_metrics(rows, scorer(rows) if rows.height else [], labels)
        why = "no labelled pair scored" if metrics["pairs"] == 0 else "one kind of label only"
        auc_or_why = metrics["auc"] if metrics["auc"] is not None else why
        found[name] = {**metrics, "labelled": labels.rows.height, "auc": auc_or_why}
    return found


def model_human_relevance(
    model: PersonalizationModel,
    train_frame: pl.DataFrame,
    held_out: pl.DataFrame,
    labels: RelevanceLabels | None,
    item_embeddings: pl.DataFrame | None = None,
) -> dict[str, dict]:
    """The model and the popularity baseline against the human relevance labels (human_relevance), each
    labelled pair scored with the newest features of its user and item in the training and held-out rows."""
    every = pl.concat([train_frame, held_out], how="diagonal_relaxed")
    pairs = labels.rows if labels is not None else pl.DataFrame(schema=RELEVANCE_SCHEMA)
    rows = labelled_pair_rows(every, pairs, model.spec.user.columns, model.spec.item.columns, item_embeddings)
    popular = popularity(train_frame)

    def popularity_scores(frame: pl.DataFrame) -> np.ndarray:
        return np.array([popular.get(i, 0.0) for i in frame.get_column("item_id").to_list()], dtype=float)

    return human_relevance({"model": model.score, "popularity": popularity_scores}, rows, labels)
