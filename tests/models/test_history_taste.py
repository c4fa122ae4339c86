"""The user tower reads taste from a history pooled through the items' categories (fast tier, no Ray):
trained on simulated users of known tastes, the model ranks a newcomer's list (an id it never saw, only
a history) by the categories of that history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import torch

from ml.personalization import (
    HISTORY_ATTRIBUTE,
    Objective,
    PersonalizationModel,
    TrainConfig,
    TwoTower,
    build_spec,
    fit,
    labelled,
)

CLUSTERS, CATEGORIES, ITEMS, USERS, DAYS = 4, 8, 80, 160, 3
HISTORY = "user_engagement__last_clicked_items"


def liked(cluster: int) -> list[int]:
    return [2 * cluster, 2 * cluster + 1]


def rows(seed: int = 7) -> tuple[pl.DataFrame, np.ndarray]:
    """Impressions biased toward each user's two liked categories, clicked far more often there; each
    row's history is the user's clicks before its day (what the daily view holds). Returns the rows
    and each item's category."""
    rng = np.random.default_rng(seed)
    cluster, category = rng.integers(0, CLUSTERS, USERS), rng.integers(0, CATEGORIES, ITEMS)
    affinity = np.full((CLUSTERS, CATEGORIES), 0.2)
    for c in range(CLUSTERS):
        affinity[c, liked(c)] = 1.0
    start, clicks, out = datetime(2026, 1, 1, tzinfo=UTC), {u: [] for u in range(USERS)}, []
    for day in range(DAYS):
        history = {u: list(items[-10:]) for u, items in clicks.items()}
        for user in range(USERS):
            weights = affinity[cluster[user], category]
            for item in rng.choice(ITEMS, 12, p=weights / weights.sum()):
                clicked = bool(rng.random() < 0.4 * affinity[cluster[user], category[item]])
                out.append((user + 1, int(item) + 1, start + timedelta(days=day, hours=12), clicked, history[user]))
                if clicked:
                    clicks[user].append(int(item) + 1)
    frame = pl.DataFrame(
        out, schema=["user_id", "item_id", "event_timestamp", "label_click", HISTORY], orient="row"
    ).with_columns(
        pl.col("label_click").cast(pl.Boolean),
        pl.lit(False).alias("label_play"),
        pl.col("item_id")
        .map_elements(lambda i: f"c{category[i - 1]}", return_dtype=pl.String)
        .alias(HISTORY_ATTRIBUTE),
    )
    return frame, category


def test_a_newcomers_list_follows_the_categories_of_their_history():
    frame, category = rows()
    train = labelled(frame)
    torch.manual_seed(0)
    # the history alone (no taste head): what its pooling through the categories learns
    config = TrainConfig(dim=8, hidden=32, epochs=8, unseen_share=0.2, taste=False, weight_decay=1e-4)
    network = TwoTower(build_spec(train, config))
    network.set_prior(train)
    network.set_history_categories(train)
    fit(Objective(network), train)
    model = PersonalizationModel(network)

    items = train.unique("item_id").sort("item_id").select("item_id", HISTORY_ATTRIBUTE)
    item_vectors = model.item_vectors(items)
    in_taste = []
    for cluster in range(CLUSTERS):
        # newcomers (ids past the trained range) with a history of five items of the cluster's categories
        mine = np.flatnonzero(np.isin(category, liked(cluster))) + 1
        histories = [np.random.default_rng(u).choice(mine, 5).tolist() for u in range(10)]
        users = pl.DataFrame({"user_id": [10_000 + u for u in range(10)], HISTORY: histories})
        scores = model.user_vectors(users) @ item_vectors.T
        for row in scores:
            top = items.get_column("item_id").to_numpy()[np.argsort(-row)[:10]]
            in_taste.append(np.isin(category[top - 1], liked(cluster)).mean())
    # a list blind to taste holds its share of the catalogue in them, far below this
    assert np.mean(in_taste) > 0.7, np.mean(in_taste)
