"""Sequential inference for online experiments: the statistics behind the A/B rows of
`monitoring/online_accuracy` and `benchmarks/experiments.py`. Plain numpy and scipy, no Dagster.

    ratio_effect(control, variant) -> Effect    Σ numerator / Σ denominator per arm over users: the
                                                difference, its delta-method standard error, and its
                                                CUPED adjustment from a pre-experiment covariate
    look(effect, planned_effect, ...) -> Look   one look's tests; none under the minimum users
    boundaries(z, information, alpha)           the group-sequential test over looks (alpha spending)
    repeated_p(z, information)                  its p-value: the smallest level it has rejected at
    always_valid_p(z, ratio)                    the mSPRT p-value of one look (take the running minimum)
    sequence_halfwidth(se, ratio, alpha)        half the width of the mSPRT's confidence sequence
    fixed_p(z)                                  the fixed-horizon two-sided p-value (one planned look)
    holm(p_values)                              Holm's step-down adjustment over a family of tests
    users_per_arm(variances, effect, ...)       the sample-size figure: users per arm for one look

Why sequential: an experiment is looked at every day, and stopping at the first day a fixed-horizon
test says p < alpha rejects a true null far more often than alpha. Two remedies are here:
- alpha spending (Lan and DeMets 1983; Jennison and Turnbull, "Group Sequential Methods", 2000): the
  plan (the sample-size figure) fixes the information the experiment will reach; each look may spend
  the share of alpha the spending function gives its information fraction, and its boundary is set so
  that, given no earlier crossing, crossing it has exactly that probability. Over the planned looks
  the false-positive rate is alpha, not less: this is the platform's decision;
- the mixture sequential probability ratio test (Robbins' normal mixture; Johari et al., "Always Valid
  Inference", 2017): its likelihood ratio is a nonnegative martingale under the null, so by Ville's
  inequality it ever exceeds 1/alpha with probability at most alpha, at any number of looks, with or
  without a plan; over a few looks it is far below alpha and pays for it in power, so it is reported.
Both estimate the variance from the data (asymptotic: Howard et al. 2021, Waudby-Smith et al. 2021), so
the guarantees hold for experiments of many users, not for a handful.

Why CUPED (Deng et al., WSDM 2013): a user's behaviour before the experiment predicts much of their
behaviour during it, and it cannot depend on the arm; subtracting theta times its arm mean removes that
predictable part, the variance falls by the squared correlation, and the expectation is unchanged.

Every function works along the last axis (users, or looks) and broadcasts over leading ones, so a
simulation can analyse a thousand experiments in one call. Every difference is variant - control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr
from scipy.stats import norm

SQRT_TAU = math.sqrt(2 * math.pi)


@dataclass(frozen=True)
class Arm:
    """One arm's users (last axis): the metric's numerator and denominator over the experiment so far
    (hits and items shown for CTR), the pre-experiment covariate (0 for a user without history) and
    which users have arrived (a simulation holds every user it will ever have)."""

    numerator: np.ndarray
    denominator: np.ndarray
    covariate: np.ndarray | None = None
    present: np.ndarray | None = None

    @classmethod
    def of(cls, numerator, denominator, covariate=None, present=None) -> Arm:
        numerator = np.asarray(numerator, dtype=float)
        covariate = np.zeros_like(numerator) if covariate is None else np.asarray(covariate, dtype=float)
        present = np.ones(numerator.shape, dtype=bool) if present is None else np.asarray(present, dtype=bool)
        return cls(numerator, np.asarray(denominator, dtype=float), covariate, present)


@dataclass(frozen=True)
class Effect:
    """variant - control of a ratio metric, plain and CUPED-adjusted (arrays over the leading axes)."""

    control_value: np.ndarray
    variant_value: np.ndarray
    control_users: np.ndarray
    variant_users: np.ndarray
    difference: np.ndarray
    se: np.ndarray
    cuped_difference: np.ndarray
    cuped_se: np.ndarray
    theta: np.ndarray
    control_variance: np.ndarray  # per user, of the linearised metric: the sample-size figure's input
    variant_variance: np.ndarray

    @property
    def variance_reduction(self) -> np.ndarray:
        """The share of the plain estimate's variance that CUPED removed."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return 1 - self.cuped_se**2 / self.se**2


@dataclass(frozen=True)
class _Linearised:
    value: np.ndarray  # Σ numerator / Σ denominator
    users: np.ndarray
    residual: np.ndarray  # per user: (numerator - value * denominator) / mean denominator; 0 when absent
    centred: np.ndarray  # per user: covariate - its arm mean; 0 when absent
    covariate_mean: np.ndarray


def _linearised(arm: Arm) -> _Linearised:
    """The delta method's per-user terms: the ratio's error is, to first order, the mean of `residual`."""
    present = arm.present
    users = present.sum(axis=-1)
    numerator = np.where(present, arm.numerator, 0.0)
    denominator = np.where(present, arm.denominator, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = numerator.sum(axis=-1) / denominator.sum(axis=-1)
        mean_denominator = denominator.sum(axis=-1) / users
        residual = (numerator - value[..., None] * denominator) / mean_denominator[..., None]
        covariate_mean = np.where(present, arm.covariate, 0.0).sum(axis=-1) / users
    residual = np.where(present, residual, 0.0)
    centred = np.where(present, arm.covariate - covariate_mean[..., None], 0.0)
    return _Linearised(value, users, residual, centred, covariate_mean)


def ratio_effect(control: Arm, variant: Arm) -> Effect:
    """variant - control of Σ numerator / Σ denominator over each arm's users, with the delta-method
    standard error, and the CUPED estimate: theta is the regression slope of the linearised metric on
    the covariate, pooled over both arms (within-arm centred), and each arm's value moves by
    theta times its covariate mean's departure. NaN where an arm has fewer than 2 users or nothing shown."""
    c, t = _linearised(control), _linearised(variant)
    with np.errstate(invalid="ignore", divide="ignore"):
        covariance = (c.residual * c.centred).sum(axis=-1) + (t.residual * t.centred).sum(axis=-1)
        spread = (c.centred**2).sum(axis=-1) + (t.centred**2).sum(axis=-1)
        theta = np.where(spread > 0, covariance / np.where(spread > 0, spread, 1.0), 0.0)
        plain_c, plain_t = _variance(c.residual, c.users), _variance(t.residual, t.users)
        adjusted_c = _variance(c.residual - theta[..., None] * c.centred, c.users)
        adjusted_t = _variance(t.residual - theta[..., None] * t.centred, t.users)
        difference = t.value - c.value
        return Effect(
            control_value=c.value,
            variant_value=t.value,
            control_users=c.users,
            variant_users=t.users,
            difference=difference,
            se=np.sqrt(plain_c / c.users + plain_t / t.users),
            cuped_difference=difference - theta * (t.covariate_mean - c.covariate_mean),
            cuped_se=np.sqrt(adjusted_c / c.users + adjusted_t / t.users),
            theta=theta,
            control_variance=plain_c,
            variant_variance=plain_t,
        )


def _variance(residual: np.ndarray, users: np.ndarray) -> np.ndarray:
    """Per-user variance of residuals whose arm mean is 0 (absent users hold 0), ddof 1."""
    mean = residual.sum(axis=-1) / users
    return ((residual**2).sum(axis=-1) - users * mean**2) / (users - 1)


# --- tests -------------------------------------------------------------------------------------------------
def mixing_constant(alpha: float) -> float:
    """tau^2 / v at the planned horizon that makes the confidence sequence narrowest there (Howard et
    al. 2021's closed-form approximation of the optimum)."""
    return -2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)


def mixture_ratio(se, planned_effect: float, alpha: float, power: float) -> np.ndarray:
    """tau^2 / v at a look whose estimate has standard error `se`. tau^2 is fixed by the plan: the
    variance the estimate will have when the experiment reaches the users its sample-size figure asks
    for (`planned_effect`, absolute, detected at `alpha` with `power`), times `mixing_constant`, so the
    confidence sequence is narrowest at the planned horizon."""
    planned_se = planned_effect / float(norm.ppf(1 - alpha / 2) + norm.ppf(power))
    with np.errstate(invalid="ignore", divide="ignore"):
        return mixing_constant(alpha) * planned_se**2 / np.asarray(se, dtype=float) ** 2


def always_valid_p(z, ratio) -> np.ndarray:
    """1 / the mSPRT likelihood ratio of a normal mixture N(0, tau^2) against 0, for an estimate with
    z-score `z` and tau^2 / v = `ratio`, capped at 1. The running minimum over looks is the always-valid
    p-value: it falls below alpha at some look with probability at most alpha under the null."""
    z, ratio = np.asarray(z, dtype=float), np.asarray(ratio, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.sqrt(1 + ratio) * np.exp(-(z**2) * ratio / (2 * (1 + ratio)))
    return np.minimum(p, 1.0)


def sequence_halfwidth(se, ratio, alpha: float) -> np.ndarray:
    """Half the width of the confidence sequence (the effects the mSPRT does not reject at `alpha`)."""
    ratio = np.asarray(ratio, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(se) * np.sqrt(2 * (1 + ratio) / ratio * np.log(np.sqrt(1 + ratio) / alpha))


def fixed_p(z) -> np.ndarray:
    """Two-sided normal p-value: valid for one look planned in advance, not for daily looks."""
    return 2 * norm.sf(np.abs(np.asarray(z, dtype=float)))


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error at most alpha when rejecting adjusted < alpha,
    whatever the dependence between the tests). NaN entries are not tests: left NaN, not counted."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    factors = len(order) - np.arange(len(order))
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * factors))
    return adjusted


def users_per_arm(variances: tuple[float, float], effect: float, alpha: float, power: float) -> int | None:
    """Users per arm a fixed-horizon two-sided z-test at `alpha` needs to detect an absolute `effect` with
    probability `power`, from the per-user variances of the two arms' linearised metric."""
    if not effect or any(math.isnan(v) for v in variances):
        return None
    z_sum = float(norm.ppf(1 - alpha / 2) + norm.ppf(power))
    return math.ceil(z_sum**2 * sum(variances) / effect**2)


@dataclass(frozen=True)
class Look:
    """One look's tests (arrays over the leading axes); NaN p-values where no test is run."""

    tested: np.ndarray  # both arms hold `minimum_users` and the estimate has a variance
    p_value: np.ndarray  # mSPRT, of the CUPED estimate: take the running minimum over looks
    fixed_p_value: np.ndarray  # fixed horizon, of the plain estimate: valid at one planned look only
    halfwidth: np.ndarray  # confidence sequence of the plain estimate
    cuped_halfwidth: np.ndarray  # ... of the CUPED estimate
    fixed_halfwidth: np.ndarray  # fixed-horizon interval of the plain estimate


def look(effect: Effect, planned_effect: float, alpha: float, power: float, minimum_users: int) -> Look:
    """The tests of one look at pooled data: an arm under `minimum_users` users gets none (the normal
    approximation does not hold there), and neither does a difference without variance."""
    enough = (effect.control_users >= minimum_users) & (effect.variant_users >= minimum_users)
    tested = enough & (np.nan_to_num(effect.cuped_se) > 0) & (np.nan_to_num(effect.se) > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        z, cuped_z = effect.difference / effect.se, effect.cuped_difference / effect.cuped_se
        ratio = mixture_ratio(effect.se, planned_effect, alpha, power)
        cuped_ratio = mixture_ratio(effect.cuped_se, planned_effect, alpha, power)
        nothing = np.full(np.shape(tested), np.nan)
        return Look(
            tested=tested,
            p_value=np.where(tested, always_valid_p(cuped_z, cuped_ratio), nothing),
            fixed_p_value=np.where(tested, fixed_p(z), nothing),
            halfwidth=np.where(tested, sequence_halfwidth(effect.se, ratio, alpha), nothing),
            cuped_halfwidth=np.where(tested, sequence_halfwidth(effect.cuped_se, cuped_ratio, alpha), nothing),
            fixed_halfwidth=np.where(tested, float(norm.ppf(1 - alpha / 2)) * effect.se, nothing),
        )


def running_minimum(p_values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The always-valid p-value at each look: the smallest so far (looks without a test are skipped)."""
    return np.fmin.accumulate(np.asarray(p_values, dtype=float), axis=axis)


# --- alpha spending ----------------------------------------------------------------------------------------
GRID = 81  # points of the sub-density between the boundaries at each look


def spent(information, alpha) -> np.ndarray:
    """Alpha spent by information fraction t (Lan and DeMets' O'Brien-Fleming-type function): little at
    the first looks, all of `alpha` at t >= 1 (the planned information)."""
    t = np.asarray(information, dtype=float)
    alpha = np.asarray(alpha, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        early = 2 * norm.sf(norm.isf(alpha / 2) / np.sqrt(np.maximum(t, 1e-12)))
    return np.where(t >= 1, alpha, early)


def crossed(z, information, alpha) -> np.ndarray:
    """Whether a two-sided group-sequential test at `alpha` has rejected by each look (last axis: looks,
    in order; leading axes broadcast with `alpha`): z-scores `z` at information fractions `information`
    (the estimate's information 1/se^2 over the planned one). See `boundaries`."""
    return boundaries(z, information, alpha)[0]


def boundaries(z, information, alpha) -> tuple[np.ndarray, np.ndarray]:
    """(rejected by each look, each look's boundary on the z scale). Each look's boundary spends what
    the spending function allows beyond the earlier looks, given that no earlier boundary was crossed
    (the sub-density of the score B(t) = z sqrt(t), carried on a grid between the boundaries); a look
    whose information is NaN or not above the last tested look's is skipped (no test, nothing spent,
    boundary infinite), as is every look once the plan's alpha is spent."""
    z, t, alpha = np.broadcast_arrays(
        np.asarray(z, dtype=float), np.asarray(information, dtype=float), np.asarray(alpha, dtype=float)[..., None]
    )
    alpha = alpha[..., 0]
    shape = z.shape[:-1]
    last_t, last_spent = np.zeros(shape), np.zeros(shape)
    grid, density = np.zeros(shape + (GRID,)), np.zeros(shape + (GRID,))  # sub-density after the last test
    rejected, out, limits = np.zeros(shape, dtype=bool), np.zeros(z.shape, dtype=bool), np.full(z.shape, np.inf)
    for k in range(z.shape[-1]):
        tk = t[..., k]
        live = np.isfinite(tk) & np.isfinite(z[..., k]) & (tk > last_t) & (last_spent < alpha - 1e-12)
        spend = np.where(live, spent(tk, alpha) - last_spent, 0.0)
        delta = np.where(live, tk - last_t, 1.0)
        first = last_t == 0  # no earlier test: the score is N(0, t) unconditionally
        bound = _boundary(grid, density, delta, spend, live, first)
        hit = live & (np.abs(z[..., k]) * np.sqrt(np.where(live, tk, 1.0)) >= bound)
        rejected |= hit
        out[..., k] = rejected
        limits[..., k] = bound / np.sqrt(np.where(live, tk, 1.0))
        grid, density = _carry(grid, density, delta, bound, live, first)
        last_t, last_spent = np.where(live, tk, last_t), np.where(live, last_spent + spend, last_spent)
    return out, limits


def _crossing(grid, density, delta, bound, first) -> np.ndarray:
    """P(|B(t_k)| >= bound and no earlier crossing), from the sub-density on `grid` at the last test."""
    sd = np.sqrt(delta)[..., None]
    b = bound[..., None]
    tails = ndtr((grid - b) / sd) + ndtr((-b - grid) / sd)
    return np.where(first, 2 * ndtr(-bound / sd[..., 0]), _integrate(grid, density * tails))


def _boundary(grid, density, delta, spend, live, first) -> np.ndarray:
    """The score boundary whose crossing probability is `spend` (bisection, all rows at once)."""
    low, high = np.zeros(np.shape(spend)), np.full(np.shape(spend), 12.0) * np.sqrt(delta + 1)
    for _ in range(30):  # the bracket shrinks below 1e-8 of its width
        middle = (low + high) / 2
        too_low = _crossing(grid, density, delta, middle, first) > spend
        low, high = np.where(too_low, middle, low), np.where(too_low, high, middle)
    return np.where(live & (spend > 0), high, np.inf)


def _carry(grid, density, delta, bound, live, first):
    """The sub-density of the score at this look between -bound and bound (not crossed), on a new grid;
    rows without a test at this look keep theirs."""
    new_grid = np.where(np.isfinite(bound), bound, 1.0)[..., None] * np.linspace(-1, 1, GRID)
    sd = np.sqrt(delta)[..., None, None]
    kernel = np.exp(-0.5 * ((new_grid[..., :, None] - grid[..., None, :]) / sd) ** 2) / (sd * SQRT_TAU)
    carried = _integrate(grid[..., None, :], density[..., None, :] * kernel)
    unconditional = np.exp(-0.5 * new_grid**2 / delta[..., None]) / np.sqrt(delta[..., None]) / SQRT_TAU
    new_density = np.where(first[..., None], unconditional, carried)
    keep = (live & np.isfinite(bound))[..., None]
    return np.where(keep, new_grid, grid), np.where(keep, new_density, density)


def _integrate(x, y) -> np.ndarray:
    return np.trapezoid(y, x, axis=-1)


LEVELS = np.geomspace(1e-4, 1.0, 97)  # the levels a repeated p-value is resolved to (10% apart)


def repeated_p(z, information) -> np.ndarray:
    """The smallest level (of LEVELS, rounded up; below the least, the least) at which the group-sequential
    test has rejected by the last look: a p-value that keeps its meaning under the daily looks, for Holm."""
    z, information = np.asarray(z, dtype=float), np.asarray(information, dtype=float)
    rejected = crossed(z[None, ...], information[None, ...], LEVELS.reshape((-1,) + (1,) * (z.ndim - 1)))[..., -1]
    return np.where(rejected.any(axis=0), LEVELS[np.argmax(rejected, axis=0)], 1.0)


def information_fraction(se, planned_effect: float, alpha: float, power: float) -> np.ndarray:
    """The information an estimate with standard error `se` holds over what the plan needs: 1 when the
    experiment has the users its sample-size figure asked for."""
    planned_se = planned_effect / float(norm.ppf(1 - alpha / 2) + norm.ppf(power))
    with np.errstate(invalid="ignore", divide="ignore"):
        return planned_se**2 / np.asarray(se, dtype=float) ** 2
