"""The strong baseline: users clustered by the categories they were shown and clicked.

A mixture of `clusters` user types fitted by EM on the training rows alone. A type has a share of the
impressions per category (what the feed shows its users) and a click propensity per category (how
often a shown item of that category is clicked or played). A user's posterior over the types comes
from the counts of their own rows; a user without rows gets the mixture's prior.

The score of (user, item) is the user's expected positives for it: the posterior-weighted exposure
times click propensity of the item's category, times the item's share of that category's positives.
One score ranks a catalogue (recall, NDCG) and scores shown impressions (AUC); a click propensity
alone, without the exposure, scored impressions worse on the simulated lake.

It reads nothing but `user_id`, `item_id`, the item's category and the label, each known when the
rows were written: no simulator truth. Plain numpy and polars, no Dagster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

CATEGORY = "item_content__category"
SMOOTHING = 1.0  # pseudo-counts of every Dirichlet/Beta prior (MAP EM; an empty category is not 0)


@dataclass(frozen=True)
class TasteClusters:
    categories: list[str]  # index -> category name
    prior: np.ndarray  # (clusters,) share of users per type
    exposure: np.ndarray  # (clusters, categories) share of a type's impressions per category
    propensity: np.ndarray  # (clusters, categories) P(positive | shown) per category
    posterior: dict[int, np.ndarray]  # user -> (clusters,) responsibilities
    item_category: dict[int, int]  # item -> category index
    item_share: dict[int, float]  # item -> its share of its category's positives (smoothed)
    unseen_share: np.ndarray  # (categories,) the share of an item without training rows

    def user_posterior(self, user: int) -> np.ndarray:
        return self.posterior.get(user, self.prior)

    def user_category_weights(self, users: np.ndarray) -> np.ndarray:
        """(users, categories) each user's expected positives per impression-share of a category."""
        return np.stack([self.user_posterior(int(u)) for u in users]) @ (self.exposure * self.propensity)

    def item_terms(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each item's category index (-1: unknown) and share of its category's positives."""
        category = np.array([self.item_category.get(int(i), -1) for i in items], dtype=np.int64)
        fallback = np.where(category >= 0, self.unseen_share[category], 0.0)
        share = np.array([self.item_share.get(int(i), f) for i, f in zip(items, fallback)])
        return category, share

    def scores(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Expected positives of each (user, item) pair; an item of unknown category scores 0."""
        category, share = self.item_terms(items)
        weights = self.user_category_weights(users)
        return np.where(category >= 0, weights[np.arange(len(items)), category], 0.0) * share

    def rank(self, users: list[int], items: np.ndarray, k: int) -> dict[int, list[int]]:
        """Each user's top k of `items`, best first (ties in the items' order)."""
        category, share = self.item_terms(items)
        weights = self.user_category_weights(np.asarray(users))
        known = np.where(category >= 0, category, 0)
        matrix = np.where(category >= 0, weights[:, known], 0.0) * share
        return {u: items[np.argsort(-matrix[r], kind="stable")[:k]].tolist() for r, u in enumerate(users)}


def item_categories(frame: pl.DataFrame) -> dict[int, str]:
    """Each item's category: its newest non-null value in the rows (a fixed attribute of the item, null
    in rows written before the item's features existed)."""
    known = frame.drop_nulls(CATEGORY).sort("event_timestamp").unique("item_id", keep="last")
    return dict(known.select("item_id", CATEGORY).iter_rows())


def fit(
    rows: pl.DataFrame,
    label: str,
    categories: dict[int, str] | None = None,
    clusters: int = 8,
    iterations: int = 100,
    seed: int = 0,
    restarts: int = 5,
) -> TasteClusters:
    """EM on labelled rows (`user_id`, `item_id`, `event_timestamp`, the category column, `label`);
    `categories`: item -> category where the rows' own are not enough (the catalogue's)."""
    by_item = {**(categories or {}), **item_categories(rows)}
    names = sorted(set(by_item.values()))
    index = {name: i for i, name in enumerate(names)}
    item_category = {item: index[name] for item, name in by_item.items()}
    shown_rows = rows.select("user_id", "item_id", label).with_columns(
        pl.col("item_id").replace_strict(item_category, default=None).alias("_category")
    )
    shown_rows = shown_rows.drop_nulls("_category")
    users, shown, positives = _user_counts(shown_rows, label, len(names))
    prior, exposure, propensity, responsibilities = _em(shown, positives, clusters, iterations, seed, restarts)
    share, unseen_share = _item_shares(shown_rows, label, len(names))
    posterior = dict(zip(users, responsibilities))
    return TasteClusters(names, prior, exposure, propensity, posterior, item_category, share, unseen_share)


def _user_counts(rows: pl.DataFrame, label: str, categories: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Per user, impressions and positives per category."""
    counts = rows.group_by("user_id", "_category").agg(pl.len().alias("n"), pl.col(label).sum().alias("k"))
    users = sorted(counts.get_column("user_id").unique().to_list())
    row = {u: i for i, u in enumerate(users)}
    shown = np.zeros((len(users), categories))
    positives = np.zeros((len(users), categories))
    for user, category, n, k in counts.iter_rows():
        shown[row[user], category] = n
        positives[row[user], category] = k
    return users, shown, positives


def _em(shown: np.ndarray, positives: np.ndarray, clusters: int, iterations: int, seed: int, restarts: int):
    """MAP EM of the mixture from `restarts` random starts, the most likely kept (one start can merge
    two clusters and never split them); returns the prior, exposure, propensity and responsibilities."""
    rng = np.random.default_rng(seed)
    best, best_likelihood = None, -np.inf
    for _ in range(restarts):
        responsibilities = np.eye(clusters)[rng.integers(0, clusters, len(shown))]
        for _ in range(iterations):
            parameters = _m_step(shown, positives, responsibilities)
            responsibilities, likelihood = _e_step(shown, positives, *parameters)
        if likelihood > best_likelihood:
            best, best_likelihood = (*parameters, responsibilities), likelihood
    return best


def _m_step(shown: np.ndarray, positives: np.ndarray, responsibilities: np.ndarray):
    clusters = responsibilities.shape[1]
    prior = (responsibilities.sum(axis=0) + SMOOTHING) / (len(shown) + SMOOTHING * clusters)
    exposure = responsibilities.T @ shown + SMOOTHING
    exposure /= exposure.sum(axis=1, keepdims=True)
    propensity = (responsibilities.T @ positives + SMOOTHING) / (responsibilities.T @ shown + 2 * SMOOTHING)
    return prior, exposure, propensity


def posterior(shown: np.ndarray, positives: np.ndarray, prior, exposure, propensity) -> np.ndarray:
    """(users, clusters) each user's posterior over the clusters from their impressions and positives per
    category (rows of zeros: the prior)."""
    return _e_step(shown, positives, prior, exposure, propensity)[0]


def _e_step(shown, positives, prior, exposure, propensity) -> tuple[np.ndarray, float]:
    """Each user's responsibilities and the data's log-likelihood under the parameters."""
    joint = (
        np.log(prior)
        + shown @ np.log(exposure).T
        + positives @ np.log(propensity).T
        + (shown - positives) @ np.log1p(-propensity).T
    )
    top = joint.max(axis=1, keepdims=True)
    responsibilities = np.exp(joint - top)
    total = responsibilities.sum(axis=1, keepdims=True)
    return responsibilities / total, float((top + np.log(total)).sum())


def _item_shares(rows: pl.DataFrame, label: str, categories: int) -> tuple[dict[int, float], np.ndarray]:
    """Each item's share of its category's positives, smoothed (an item shown twice is not judged on
    two impressions), and per category the share of an item without rows."""
    items = rows.group_by("item_id", "_category").agg(pl.col(label).sum().alias("k"))
    per_category = items.group_by("_category").agg(pl.col("k").sum().alias("ck"), pl.len().alias("items"))
    items = items.join(per_category, on="_category")
    share = (pl.col("k") + SMOOTHING) / (pl.col("ck") + SMOOTHING * pl.col("items"))
    shares = dict(items.select("item_id", share).iter_rows())
    unseen = np.zeros(categories)
    for category, positives, count in per_category.iter_rows():
        unseen[category] = SMOOTHING / (positives + SMOOTHING * count)
    return shares, unseen
