"""Two models compared on the same rows: the one paired-test implementation of the platform (the offline
promotion gate, offline experiment reports and online promotion evidence all use it). Plain numpy and
scipy, no Dagster.

    paired_bootstrap(a, b, users=...) -> Comparison   any per-row metric, users resampled (cluster bootstrap)
    delong(labels, scores_a, scores_b) -> Comparison  AUC of two scores on the same rows (DeLong et al. 1988)
    judge(comparison, margin=...) -> Judgement        non-inferiority and superiority, margin and level stated

Why paired and why users: both models are scored on the same rows, so the row-to-row noise they share
cancels in the difference and a real gap of a few thousandths is visible where two independent
intervals would overlap. Rows of one user are not independent (one taste, one session), so the bootstrap
draws users with all their rows, as an experiment randomizes users; resampling rows would pretend to
more evidence than there is and claim differences that seeds alone produce.

Every difference is b - a: `a` is the incumbent (champion, control, baseline), `b` the challenger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm, rankdata

CELLS_PER_BLOCK = 1 << 22  # bootstrap draws held in memory at once (resamples x users)


@dataclass(frozen=True)
class Comparison:
    """b - a with a two-sided interval at `level`, the p-value of "no difference" and the units it rests on."""

    method: str
    estimate_a: float
    estimate_b: float
    difference: float
    standard_error: float
    low: float
    high: float
    p_value: float
    level: float
    units: int  # users (bootstrap) or rows (DeLong)

    def as_dict(self) -> dict[str, float | int | str]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Judgement:
    """What a comparison shows about b against a, with the margin and the level it used."""

    non_inferior: bool  # b is not worse than a by more than `margin`
    superior: bool  # b is better than a
    margin: float
    level: float  # of the two-sided interval; each one-sided test is at (1 - level) / 2
    reason: str


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    *,
    users: np.ndarray,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Comparison:
    """Mean of per-row metric values `b` against `a` on the same rows, `users[i]` owning row i.

    The estimates are means over rows (a user with more rows weighs more, as in the metric itself);
    the interval is the percentile interval of the difference over `resamples` resamples of users with
    replacement, and the p-value the smallest two-sided level whose interval excludes 0 (so the two
    agree). Reproducible: the same `seed` gives the same interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    users = np.asarray(users)
    if not (a.shape == b.shape == users.shape) or a.ndim != 1:
        raise ValueError(f"a, b and users must be 1-d and of one length, got {a.shape}, {b.shape}, {users.shape}")
    if np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("metric values contain NaN: drop or fill the rows explicitly before comparing")
    _, owner = np.unique(users, return_inverse=True)
    n_users = int(owner.max()) + 1 if len(owner) else 0
    if n_users < 2:
        raise ValueError(f"a paired bootstrap needs at least 2 users, got {n_users}")
    rows = np.bincount(owner, minlength=n_users).astype(float)
    sum_a = np.bincount(owner, weights=a, minlength=n_users)
    sum_b = np.bincount(owner, weights=b, minlength=n_users)
    mean_a, mean_b = sum_a.sum() / rows.sum(), sum_b.sum() / rows.sum()
    draws = _user_resamples(sum_b - sum_a, rows, resamples, seed)
    tail = (1 - level) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    below, above = (1 + np.sum(draws <= 0)) / (resamples + 1), (1 + np.sum(draws >= 0)) / (resamples + 1)
    return Comparison(
        method=f"paired bootstrap over {n_users} users ({resamples} resamples, seed {seed})",
        estimate_a=float(mean_a),
        estimate_b=float(mean_b),
        difference=float(mean_b - mean_a),
        standard_error=float(np.std(draws, ddof=1)),
        low=float(low),
        high=float(high),
        p_value=float(min(1.0, 2 * min(below, above))),
        level=level,
        units=n_users,
    )


def _user_resamples(sums: np.ndarray, rows: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The row-weighted mean of `sums` over users drawn with replacement, once per resample."""
    rng = np.random.default_rng(seed)
    n = len(sums)
    per_block = max(1, CELLS_PER_BLOCK // n)
    out = np.empty(resamples)
    for start in range(0, resamples, per_block):
        picks = rng.integers(0, n, size=(min(per_block, resamples - start), n))
        out[start : start + len(picks)] = sums[picks].sum(axis=1) / rows[picks].sum(axis=1)
    return out


def delong(labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray, *, level: float = 0.95) -> Comparison:
    """AUC of `scores_b` against `scores_a` on the same labelled rows, with DeLong's variance of the
    difference (the two AUCs' covariance from their placement values; fast midrank form of Sun and Xu,
    2014). Rows are taken as independent: with many rows per user prefer `paired_bootstrap` over users."""
    labels = np.asarray(labels, dtype=bool)
    scores = np.vstack([np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)])
    if scores.shape[1] != len(labels):
        raise ValueError(f"labels and scores must be of one length, got {len(labels)} and {scores.shape[1]}")
    positives, negatives = scores[:, labels], scores[:, ~labels]
    m, n = positives.shape[1], negatives.shape[1]
    if m < 2 or n < 2:
        raise ValueError(f"DeLong needs at least 2 positive and 2 negative rows, got {m} and {n}")
    # placement values from midranks: within the positives, the negatives, and all rows together
    rank_pos = rankdata(positives, axis=1)
    rank_neg = rankdata(negatives, axis=1)
    rank_all = rankdata(np.hstack([positives, negatives]), axis=1)
    aucs = (rank_all[:, :m].sum(axis=1) - m * (m + 1) / 2) / (m * n)
    v10 = (rank_all[:, :m] - rank_pos) / n  # per positive: share of negatives scored below it
    v01 = 1 - (rank_all[:, m:] - rank_neg) / m  # per negative: share of positives scored above it
    covariance = np.cov(v10) / m + np.cov(v01) / n
    variance = covariance[0, 0] + covariance[1, 1] - 2 * covariance[0, 1]
    se = math.sqrt(max(float(variance), 0.0))
    difference = float(aucs[1] - aucs[0])
    z = norm.ppf(1 - (1 - level) / 2)
    p = float(2 * norm.sf(abs(difference) / se)) if se > 0 else (1.0 if difference == 0 else 0.0)
    return Comparison(
        method=f"DeLong on {m + n} rows ({m} positive)",
        estimate_a=float(aucs[0]),
        estimate_b=float(aucs[1]),
        difference=difference,
        standard_error=se,
        low=float(difference - z * se),
        high=float(difference + z * se),
        p_value=p,
        level=level,
        units=m + n,
    )


def judge(comparison: Comparison, *, margin: float, higher_is_better: bool = True) -> Judgement:
    """b non-inferior when its interval excludes a loss larger than `margin`; superior when it excludes
    any loss and no gain (the interval lies wholly on the better side of 0). Each is a one-sided test at
    (1 - level) / 2, e.g. 2.5% for a 95% interval."""
    if margin < 0:
        raise ValueError(f"a margin is a tolerated loss, >= 0; got {margin}")
    sign = 1.0 if higher_is_better else -1.0
    worst = min(sign * comparison.low, sign * comparison.high)  # the interval's end on the losing side
    non_inferior, superior = worst > -margin, worst > 0
    tested = f"{(1 - comparison.level) / 2:.3g} one-sided"
    interval = f"[{comparison.low:+.4g}, {comparison.high:+.4g}]"
    if superior:
        reason = f"better: difference {comparison.difference:+.4g}, interval {interval} above 0 ({tested})"
    elif non_inferior:
        reason = f"not worse by more than {margin:g} ({tested}), not shown better: interval {interval}"
    else:
        reason = f"may be worse by more than {margin:g} ({tested}): interval {interval}"
    return Judgement(non_inferior, superior, margin, comparison.level, reason)
