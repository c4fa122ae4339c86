"""ml/comparison.py proven by simulation: data with a known difference (or none), drawn many times, and
the share of intervals that cover the truth or of tests that reject it.

Tolerances come from the number of simulated datasets R: a rate whose true value is p is estimated with
standard error sqrt(p(1-p)/R); the bounds are p +- 3 standard errors (a correct method falls outside
about once in 370 runs; the seeds are fixed, so a run is reproducible). A wrong method falls outside:
each test also runs the naive variant on the same data and shows that it does."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from ml.comparison import Comparison, delong, judge, paired_bootstrap
from ml.evaluation import auc

RUNS = 300


def bounds(p: float, runs: int = RUNS) -> tuple[float, float]:
    se = math.sqrt(p * (1 - p) / runs)
    return p - 3 * se, p + 3 * se


def users_rows(rng: np.random.Generator, users: int, effect: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row metric values of two models for `users` users with 1-9 rows each. Each user has a taste
    (shared by both models) and an own response to the challenger (shared by all their rows): rows of one
    user are correlated, as impressions of one user are. The true mean difference is `effect`."""
    counts = 1 + rng.poisson(3, users)
    owner = np.repeat(np.arange(users), counts)
    taste = rng.normal(0, 1, users)[owner]
    response = rng.normal(effect, 0.6, users)[owner]
    a = taste + rng.normal(0, 0.3, len(owner))
    b = taste + response + rng.normal(0, 0.3, len(owner))
    return a, b, owner


def test_paired_bootstrap_covers_the_true_difference_and_holds_its_false_positive_rate():
    rng = np.random.default_rng(7)
    covered, rejected, rejected_by_rows = 0, 0, 0
    for run in range(RUNS):
        a, b, owner = users_rows(rng, 60, effect=0.2)
        result = paired_bootstrap(a, b, users=owner, resamples=400, seed=run)
        covered += result.low <= 0.2 <= result.high
        a0, b0, owner0 = users_rows(rng, 60, effect=0.0)
        rejected += paired_bootstrap(a0, b0, users=owner0, resamples=400, seed=run).p_value < 0.05
        # the naive bootstrap: rows resampled as if independent
        rejected_by_rows += paired_bootstrap(a0, b0, users=np.arange(len(a0)), resamples=400, seed=run).p_value < 0.05
    low, high = bounds(0.95)
    assert low <= covered / RUNS <= high, f"coverage {covered / RUNS:.3f} outside [{low:.3f}, {high:.3f}]"
    low, high = bounds(0.05)
    assert low <= rejected / RUNS <= high, f"false-positive rate {rejected / RUNS:.3f} outside [{low:.3f}, {high:.3f}]"
    assert rejected_by_rows / RUNS > high, "resampling rows should over-reject on correlated rows"


def test_paired_bootstrap_is_reproducible_and_agrees_with_its_interval():
    rng = np.random.default_rng(1)
    a, b, owner = users_rows(rng, 40, effect=0.1)
    first, again = (paired_bootstrap(a, b, users=owner, seed=3) for _ in range(2))
    assert first == again
    assert first.units == 40
    rows = np.bincount(owner)
    assert first.difference == pytest.approx(np.mean(b - a))
    assert first.estimate_a == pytest.approx(np.sum(np.bincount(owner, weights=a)) / rows.sum())
    # p < 1 - level exactly when the interval excludes 0
    assert (first.p_value < 0.05) == (first.low > 0 or first.high < 0)
    with pytest.raises(ValueError, match="NaN"):
        paired_bootstrap(np.array([1.0, np.nan]), np.array([1.0, 2.0]), users=np.array([1, 2]))
    with pytest.raises(ValueError, match="2 users"):
        paired_bootstrap(np.ones(3), np.ones(3), users=np.zeros(3))


def binormal(rng: np.random.Generator, rows: int, shift_a: float, shift_b: float) -> tuple[np.ndarray, ...]:
    """Half positive rows; each model scores a positive N(shift, 1) and a negative N(0, 1), the two models'
    noise correlated 0.6 (they see the same rows). The true AUC is Phi(shift / sqrt(2))."""
    labels = np.arange(rows) < rows // 2
    first, second = rng.normal(size=(2, rows))
    return labels, first + shift_a * labels, 0.6 * first + 0.8 * second + shift_b * labels


def true_auc(shift: float) -> float:
    return float(norm.cdf(shift / math.sqrt(2)))


def test_delong_covers_the_true_auc_difference_and_holds_its_false_positive_rate():
    """The two scores' noise is correlated: a variance without their covariance (as if the AUCs were of
    different rows) would reject almost never under the null and fall below the lower bound."""
    rng = np.random.default_rng(11)
    truth = true_auc(1.1) - true_auc(0.9)
    covered, rejected = 0, 0
    for _ in range(RUNS):
        labels, a, b = binormal(rng, 300, 0.9, 1.1)
        result = delong(labels, a, b)
        covered += result.low <= truth <= result.high
        labels, a, b = binormal(rng, 300, 1.0, 1.0)
        null = delong(labels, a, b)
        rejected += null.p_value < 0.05
        assert null.estimate_a == pytest.approx(auc(labels, a))
        assert null.estimate_b == pytest.approx(auc(labels, b))
    low, high = bounds(0.95)
    assert low <= covered / RUNS <= high, f"coverage {covered / RUNS:.3f} outside [{low:.3f}, {high:.3f}]"
    low, high = bounds(0.05)
    assert low <= rejected / RUNS <= high, f"false-positive rate {rejected / RUNS:.3f} outside [{low:.3f}, {high:.3f}]"


def test_non_inferiority_at_the_margin_is_declared_at_most_at_its_stated_level():
    """Truth exactly at the margin (the challenger worse by `margin`): "not worse by more than the margin"
    is a false claim, made at most (1 - level) / 2 = 2.5% of the time; with no true loss it is made most
    of the time at this size (about 70%)."""
    rng = np.random.default_rng(5)
    margin = true_auc(1.0) - true_auc(0.8)
    at_margin, no_loss = 0, 0
    for _ in range(RUNS):
        labels, a, b = binormal(rng, 600, 1.0, 0.8)
        verdict = judge(delong(labels, a, b), margin=margin)
        at_margin += verdict.non_inferior
        assert not verdict.superior or verdict.non_inferior
        labels, a, b = binormal(rng, 600, 1.0, 1.0)
        no_loss += judge(delong(labels, a, b), margin=margin).non_inferior
    assert at_margin / RUNS <= bounds(0.025)[1], f"non-inferiority claimed {at_margin / RUNS:.3f} at the margin"
    assert no_loss / RUNS >= 0.5
    assert verdict.margin == margin and verdict.level == 0.95 and "0.025 one-sided" in verdict.reason


def test_judge_reads_the_losing_side_of_the_interval():
    def comparison(low: float, high: float) -> Comparison:
        return Comparison("t", 0.5, 0.5, (low + high) / 2, 0.01, low, high, 0.5, 0.95, 100)

    assert judge(comparison(0.001, 0.02), margin=0.01).superior
    inferior = judge(comparison(-0.02, 0.01), margin=0.01)
    assert not inferior.non_inferior and "worse by more than 0.01" in inferior.reason
    # lower is better (a loss, a latency): the upper end is the losing side
    assert judge(comparison(-0.02, 0.005), margin=0.01, higher_is_better=False).non_inferior
    assert not judge(comparison(-0.02, 0.005), margin=0.01, higher_is_better=False).superior
