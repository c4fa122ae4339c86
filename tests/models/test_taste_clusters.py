"""The taste-cluster baseline on simulated users whose taste clusters are known (fast tier, no Ray): the
mixture finds the clusters from the rows alone and ranks the next day's clicks better than popularity."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl

from ml import taste_clusters
from ml.evaluation import auc, popularity, ranking_metrics, relevant_items, split_held_out, taste_cluster_metrics
from ml.personalization import LABEL, labelled

CLUSTERS, CATEGORIES, ITEMS, USERS = 4, 8, 120, 240


def world(seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each user's cluster, each cluster's liked categories (x4 weight on two), each item's category
    and latent popularity."""
    rng = np.random.default_rng(seed)
    cluster = rng.integers(0, CLUSTERS, USERS)
    affinity = np.full((CLUSTERS, CATEGORIES), 0.3)
    for c in range(CLUSTERS):
        affinity[c, [2 * c, 2 * c + 1]] = 1.2  # disjoint pairs, so each cluster is identifiable
    return cluster, affinity, rng.integers(0, CATEGORIES, ITEMS), rng.normal(0, 1, ITEMS)


def impressions(days: int, seed: int = 4) -> tuple[pl.DataFrame, np.ndarray]:
    """Rows like the training set's: a feed biased toward popular items of the user's taste, clicks
    more likely on both; returns the rows and each user's true cluster (user id = index + 1)."""
    cluster, affinity, category, pop = world()
    rng = np.random.default_rng(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    names = np.array([f"category{c}" for c in range(CATEGORIES)])
    frames = []
    for day in range(days):
        users = np.repeat(np.flatnonzero(rng.random(USERS) < 0.7), 15)
        exposure = np.exp(0.8 * pop)[None, :] * affinity[cluster[users]][:, category]
        cumulative = np.cumsum(exposure / exposure.sum(axis=1, keepdims=True), axis=1)
        items = (cumulative < rng.random((len(users), 1))).sum(axis=1)
        logit = -2.5 + 1.2 * np.log(affinity[cluster[users], category[items]] / 0.3) + 0.3 * pop[items]
        clicked = rng.random(len(users)) < 1 / (1 + np.exp(-logit))
        seconds = rng.integers(0, 86_400, len(users))
        frames.append(
            pl.DataFrame(
                {
                    "user_id": users + 1,
                    "item_id": items + 1,
                    "event_timestamp": [start + timedelta(days=day, seconds=int(s)) for s in seconds],
                    "label_click": clicked,
                    "label_play": np.zeros(len(users), dtype=bool),
                    # null on the first day, as a daily view's features are before its first run
                    taste_clusters.CATEGORY: None if day == 0 else names[category[items]],
                },
                schema_overrides={taste_clusters.CATEGORY: pl.String},
            )
        )
    return pl.concat(frames), cluster


def test_the_mixture_recovers_the_users_taste_clusters():
    rows, truth = impressions(days=3)
    mixture = taste_clusters.fit(labelled(rows), LABEL, clusters=CLUSTERS)
    users = sorted(mixture.posterior)
    found = np.array([int(np.argmax(mixture.posterior[u])) for u in users])
    true = truth[np.array(users) - 1]
    # purity: each found cluster's users mostly share one true cluster, and every true one is found
    purity = sum(np.bincount(true[found == f]).max() for f in set(found)) / len(users)
    assert purity > 0.9, purity
    assert len(set(found)) == CLUSTERS


def test_the_first_days_null_categories_are_filled_from_later_rows():
    rows, _ = impressions(days=2)
    categories = taste_clusters.item_categories(rows)
    first_day = rows.filter(pl.col("event_timestamp").dt.day() == 1)
    assert first_day.get_column(taste_clusters.CATEGORY).null_count() == first_day.height
    later = rows.drop_nulls(taste_clusters.CATEGORY).unique("item_id")
    assert all(categories[i] == c for i, c in later.select("item_id", taste_clusters.CATEGORY).iter_rows())


def test_it_beats_popularity_on_the_held_out_day():
    rows, _ = impressions(days=4)
    train, held_out = split_held_out(rows)
    mine = taste_cluster_metrics(train, held_out, k=10)
    held = labelled(held_out)
    relevant = relevant_items(held)
    popular = popularity(train)
    order = sorted(sorted(set(rows.get_column("item_id").to_list())), key=lambda i: -popular.get(i, 0.0))[:10]
    baseline = {
        "auc": auc(held.get_column(LABEL).to_numpy() > 0, np.array([popular.get(i, 0.0) for i in held["item_id"]])),
        **ranking_metrics({u: order for u in relevant}, relevant, 10),
    }
    for metric in ("auc", "recall@10", "ndcg@10"):
        assert mine[metric] > baseline[metric] + 0.02, (metric, mine, baseline)


def test_a_known_users_list_keeps_to_their_taste_and_a_strangers_spans_the_clusters():
    rows, truth = impressions(days=3)
    mixture = taste_clusters.fit(labelled(rows), LABEL, clusters=CLUSTERS)
    catalogue = np.array(sorted(set(rows.get_column("item_id").to_list())))
    known = sorted(mixture.posterior)
    lists = mixture.rank([*known, 10_000], catalogue, 10)
    names = mixture.categories
    liked = {u: {f"category{2 * truth[u - 1]}", f"category{2 * truth[u - 1] + 1}"} for u in known}
    within = [all(names[mixture.item_category[i]] in liked[u] for i in lists[u]) for u in known]
    assert np.mean(within) > 0.9, np.mean(within)
    # a user the rows never saw is ranked by the mixture's prior, across the clusters' tastes
    assert len({mixture.item_category[i] for i in lists[10_000]}) >= 3
