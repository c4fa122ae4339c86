"""The copy scorer: a logistic regression over the features of an item's best match (`copy_match`), so
that more than one cut decides. A disguised copy has one original it is nearly identical to; a shared
template or a common look is nearly as similar to several earlier items (a small margin); a creator's
re-upload of their own design is closest to their own earlier item; a copy comes after its original.

Plain numpy: features standardized on the training rows, an L2 penalty (which also keeps the weights
finite when the classes separate), fitted by Newton's method. An item without an earlier item of another
creator to match has no copy score and is never flagged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy.special import expit

FEATURES = (
    "nines",  # -log(1 - verified similarity to the best match): a copy's 0.99 and 0.999 differ as 0.5 and 0.9
    "log_margin",  # over the next-best candidate of another design (the similarity itself without one)
    "other_creator_best",  # 1 when no earlier item of the item's own creator verifies as high
    "log_days_after_original",  # time order: how long after its original the item came
)
MIN_GAP = 1e-4  # similarity is capped at 1 - MIN_GAP before the log
MARGIN_FLOOR = 0.01  # added to the margin before the log
PENALTY = 1.0  # L2 on the standardized weights
NEWTON_STEPS = 50


def copy_features(matches: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(features: rows x FEATURES, matched: whether the row has a match) of `matches` (MATCH_SCHEMA); a
    row without a match gets zeros."""
    similarity = pl.col("similarity").fill_null(0.0).cast(pl.Float64)
    own = pl.col("own_similarity")
    frame = matches.select(
        matched=pl.col("similarity").is_not_null(),
        nines=-(1 - similarity.clip(upper_bound=1 - MIN_GAP)).log(),
        log_margin=(pl.col("margin").cast(pl.Float64).fill_null(similarity).clip(lower_bound=0.0) + MARGIN_FLOOR).log(),
        other_creator_best=(own.is_null() | (similarity > own)).cast(pl.Float64),
        log_days_after_original=pl.col("days_after_original").fill_null(0.0).clip(lower_bound=0.0).log1p(),
    )
    matched = frame["matched"].to_numpy()
    features = frame.select(FEATURES).to_numpy().astype(np.float64)
    features[~matched] = 0.0
    return features, matched


@dataclass(frozen=True)
class CopyModel:
    """P(copy | features) = sigmoid(bias + weights . (features - mean) / scale)."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float

    def score(self, features: np.ndarray) -> np.ndarray:
        z = (features - np.asarray(self.mean)) / np.asarray(self.scale)
        return expit(z @ np.asarray(self.weights) + self.bias)

    def weighted(self) -> list[tuple[str, float]]:
        """(feature, weight per standard deviation) pairs."""
        return list(zip(self.features, self.weights, strict=True))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, saved: dict) -> CopyModel:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()}
        return cls(**fields)


def fit(
    features: np.ndarray, positive: np.ndarray, penalty: float = PENALTY, names: tuple[str, ...] = FEATURES
) -> CopyModel:
    """L2-penalized logistic regression (bias not penalized) by Newton's method; `names`: the columns'."""
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    scale = np.where(scale > 1e-9, scale, 1.0)  # a constant feature gets weight 0 from the penalty
    x = np.hstack([np.ones((len(features), 1)), (features - mean) / scale])
    y = positive.astype(np.float64)
    ridge = np.diag([0.0] + [penalty] * features.shape[1])
    w = np.zeros(x.shape[1])
    w[0] = np.log((y.sum() + 0.5) / (len(y) - y.sum() + 0.5))

    def loss(w: np.ndarray) -> float:
        logits = x @ w
        return float(np.sum(np.logaddexp(0, logits) - y * logits) + w @ ridge @ w / 2)

    for _ in range(NEWTON_STEPS):
        p = expit(x @ w)
        gradient = x.T @ (p - y) + ridge @ w
        hessian = (x * (p * (1 - p))[:, None]).T @ x + ridge + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hessian, gradient)
        size, before = 1.0, loss(w)
        while loss(w - size * step) > before and size > 1e-6:  # halve a step that overshoots
            size /= 2
        w -= size * step
        if np.abs(size * step).max() < 1e-9:
            break
    return CopyModel(names, tuple(mean.tolist()), tuple(scale.tolist()), tuple(w[1:].tolist()), float(w[0]))
