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
BATCH_CELLS = 4_000_000  # models x rows x columns fitted together (32 MB a copy)


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
    return fit_many(features, positive, np.ones((1, len(positive))), penalty, names)[0]


def fit_many(
    features: np.ndarray,
    positive: np.ndarray,
    counts: np.ndarray,
    penalty: float = PENALTY,
    names: tuple[str, ...] = FEATURES,
) -> list[CopyModel]:
    """One model per row of `counts` (models x rows: how often each row is in that model's training set,
    0 for a row left out), fitted together: each the same as `fit` on its rows repeated that many times. A
    bootstrap or cross-validation fits hundreds of small models; one batched Newton solve replaces a
    Python loop of them."""
    counts = np.asarray(counts, dtype=np.float64)
    batch = max(1, BATCH_CELLS // (features.size + len(features)))
    if len(counts) > batch:  # bounded memory: models x rows x columns at a time
        return [
            m
            for i in range(0, len(counts), batch)
            for m in fit_many(features, positive, counts[i : i + batch], penalty, names)
        ]
    total = counts.sum(axis=1)
    mean = counts @ features / total[:, None]
    centred = features[None, :, :] - mean[:, None, :]
    scale = np.sqrt((counts[:, None, :] @ centred**2)[:, 0] / total[:, None])
    scale = np.where(scale > 1e-9, scale, 1.0)  # a constant feature gets weight 0 from the penalty
    x = np.concatenate([np.ones(centred.shape[:2] + (1,)), centred / scale[:, None, :]], axis=2)
    y = positive.astype(np.float64)
    w = np.zeros((len(counts), x.shape[2]))
    w[:, 0] = np.log((counts @ y + 0.5) / (total - counts @ y + 0.5))
    w = _newton(x, y, counts, w, np.array([0.0] + [penalty] * features.shape[1]))
    return [
        CopyModel(names, tuple(m.tolist()), tuple(s.tolist()), tuple(c[1:].tolist()), float(c[0]))
        for m, s, c in zip(mean, scale, w, strict=True)
    ]


def _newton(x: np.ndarray, y: np.ndarray, counts: np.ndarray, w: np.ndarray, ridge: np.ndarray) -> np.ndarray:
    """Newton's method from `w` on each model's penalized log-loss (`x`: models x rows x columns); a step
    that overshoots is halved, a model stops once its step is below 1e-9 (the others go on without it)."""
    w, active = w.copy(), np.arange(len(w))

    def loss(x: np.ndarray, counts: np.ndarray, w: np.ndarray) -> np.ndarray:
        logits = (x @ w[:, :, None])[:, :, 0]
        return ((np.logaddexp(0, logits) - y * logits) * counts).sum(axis=1) + (w * w) @ ridge / 2

    current = loss(x, counts, w)  # each model's loss at its w: an accepted trial's, not evaluated again
    for _ in range(NEWTON_STEPS):
        xa, ca, wa = x[active], counts[active], w[active]
        p = expit((xa @ wa[:, :, None])[:, :, 0])
        gradient = ((ca * (p - y))[:, None, :] @ xa)[:, 0] + ridge * wa
        hessian = (xa.transpose(0, 2, 1) * (ca * p * (1 - p))[:, None, :]) @ xa + np.diag(ridge + 1e-9)
        step = np.linalg.solve(hessian, gradient[:, :, None])[:, :, 0]
        size, before, trial = np.ones(len(wa)), current[active], loss(xa, ca, wa - step)
        overshoots = (trial > before) & (size > 1e-6)
        while overshoots.any():  # rare: only the overshooting models are evaluated again
            size[overshoots] /= 2
            shrunk = np.flatnonzero(overshoots)
            trial[shrunk] = loss(xa[shrunk], ca[shrunk], wa[shrunk] - size[shrunk, None] * step[shrunk])
            overshoots[shrunk] = (trial[shrunk] > before[shrunk]) & (size[shrunk] > 1e-6)
        w[active], current[active] = wa - size[:, None] * step, trial
        active = active[np.abs(size[:, None] * step).max(axis=1) >= 1e-9]
        if not len(active):
            break
    return w
