"""The experiment statistics proven by simulation on the simulator's users (simulator.experiment_users):
daily looks at pooled days keep the false-positive rate where a per-day test does not, the sample-size
figure's promised power is met, and CUPED removes the variance the pre-experiment metric explains
without moving the estimate. benchmarks/experiments.py runs the same proofs with 1,000 runs and the
issue's 2% lift; here 400 runs planned for a 5% lift (fewer users, seconds), and every band is widened
by the binomial standard error of 400 runs: the issue's band is +-1.5 points at 1,000 runs, +-2.4 here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engines.experimentation.sequential import Arm, crossed, fixed_p, holm, ratio_effect, repeated_p, users_per_arm
from simulator.experiment_users import Plan, Population, pooled_effects, rejections, simulate

RUNS, DAYS, LIFT = 400, 14, 0.05
WIDENED = 0.015 * math.sqrt(1000 / RUNS)  # the issue's +-1.5 points at 1,000 runs, at RUNS runs


@pytest.fixture(scope="module")
def population() -> Population:
    return Population.of_world()


@pytest.fixture(scope="module")
def planned(population) -> tuple[Plan, int]:
    """The plan and its sample-size figure, from a pilot A/A (another seed): users per arm for LIFT."""
    plan = Plan(effect=LIFT * population.mean_click_probability)
    pilot = pooled_effects(simulate(population, 20, 2_000, DAYS, np.random.default_rng(100)))
    variances = (float(np.mean(pilot.control_variance[:, -1])), float(np.mean(pilot.variant_variance[:, -1])))
    return plan, users_per_arm(variances, plan.effect, plan.alpha, plan.power)


def rates(population, plan: Plan, users_per_arm: int, lift: float, seed: int) -> dict[str, float]:
    rng, found = np.random.default_rng(seed), {}
    for _ in range(RUNS // 100):
        experiments = simulate(population, 100, 2 * users_per_arm, DAYS, rng, lift=lift)
        for method, rejected in rejections(experiments, plan).items():
            found[method] = found.get(method, 0) + int(rejected.sum())
    return {method: n / RUNS for method, n in found.items()}


def test_daily_looks_at_pooled_days_keep_alpha_where_per_day_tests_do_not(population, planned):
    plan, n = planned
    found = rates(population, plan, n, lift=0.0, seed=1)
    assert abs(found["group_sequential"] - plan.alpha) <= WIDENED
    assert found["msprt"] <= plan.alpha + WIDENED  # always valid, and conservative at 14 looks
    assert abs(found["fixed_horizon"] - plan.alpha) <= WIDENED  # one planned look is fine too
    assert found["pooled_daily_z"] > 0.12 and found["newest_day_z"] > 0.3  # peeking is not


def test_a_known_lift_is_found_with_the_power_the_sample_size_figure_promised(population, planned):
    plan, n = planned
    found = rates(population, plan, n, lift=LIFT, seed=2)
    widened = 0.05 * math.sqrt(1000 / RUNS)
    assert abs(found["fixed_horizon"] - plan.power) <= widened
    # alpha spending pays little power for its daily looks; the mSPRT pays much more
    assert found["group_sequential"] >= plan.power - widened
    assert found["msprt"] < found["group_sequential"]


def test_cuped_removes_the_variance_the_pre_period_explains_and_moves_no_estimate(population):
    rng = np.random.default_rng(3)
    experiments = simulate(population, 300, 2_000, DAYS, rng, lift=LIFT)
    effect = pooled_effects(experiments, "clicks_per_user")
    plain, cuped = effect.difference[:, -1], effect.cuped_difference[:, -1]
    hits = experiments.hits.sum(axis=1)
    runs = zip(hits, experiments.pre_hits, experiments.in_variant)
    correlation = np.mean([np.corrcoef(h[v == arm], x[v == arm])[0, 1] for h, x, v in runs for arm in (0, 1)])
    measured = 1 - np.var(cuped) / np.var(plain)
    assert correlation**2 > 0.2  # active users stay active: the covariate explains much
    assert measured == pytest.approx(correlation**2, abs=0.08)  # the F-ratio's spread at 300 runs
    assert np.mean(effect.variance_reduction[:, -1]) == pytest.approx(correlation**2, abs=0.03)
    truth = LIFT * np.mean(effect.control_value[:, -1])
    assert abs(np.mean(cuped) - truth) < 3 * np.std(cuped) / math.sqrt(len(cuped))  # unbiased
    assert abs(np.mean(plain) - truth) < 3 * np.std(plain) / math.sqrt(len(plain))


def test_one_look_at_the_planned_information_is_the_fixed_horizon_z_test():
    z = np.array([[1.95], [1.97], [-2.5], [0.3]])
    assert crossed(z, np.ones_like(z), 0.05)[:, -1].tolist() == (fixed_p(z[:, 0]) < 0.05).tolist()
    p = repeated_p(z, np.ones_like(z))
    assert np.all(p >= fixed_p(z[:, 0]) - 1e-12) and np.all(p <= fixed_p(z[:, 0]) * 1.11)  # levels 10% apart


def test_later_looks_need_more_than_the_fixed_horizon_z_and_untested_looks_spend_nothing():
    # three looks: a z of 2.2 at a third of the information is not enough under O'Brien-Fleming spending
    z = np.array([[2.2, 1.0, 1.0], [np.nan, np.nan, 1.97]])
    information = np.array([[1 / 3, 2 / 3, 1.0], [np.nan, np.nan, 1.0]])
    assert crossed(z, information, 0.05).tolist() == [[False, False, False], [False, False, True]]


def test_holm_adjusts_step_down_and_leaves_untested_rows_out():
    adjusted = holm([0.01, np.nan, 0.04, 0.03])
    assert adjusted[0] == pytest.approx(0.03) and math.isnan(adjusted[1])
    assert adjusted[3] == pytest.approx(0.06) and adjusted[2] == pytest.approx(0.06)  # monotone


def test_the_ratio_effect_is_the_delta_method_of_each_arm():
    rng = np.random.default_rng(4)
    shown = rng.poisson(20, size=(2, 500)) + 1
    hits = rng.binomial(shown, 0.1)
    effect = ratio_effect(Arm.of(hits[0], shown[0]), Arm.of(hits[1], shown[1]))
    for arm, value in ((0, effect.control_value), (1, effect.variant_value)):
        ratio = hits[arm].sum() / shown[arm].sum()
        assert value == pytest.approx(ratio)
    residual = [(hits[a] - hits[a].sum() / shown[a].sum() * shown[a]) / shown[a].mean() for a in (0, 1)]
    se = math.sqrt(sum(np.var(r, ddof=1) / 500 for r in residual))
    assert effect.se == pytest.approx(se) and effect.cuped_se == pytest.approx(se)  # no covariate: no change
