"""Experiment statistics: do the online A/B tests keep their false-positive rate under daily looks, find
the effect they were sized for, catch a sample-ratio mismatch, does CUPED pay, and do twenty concurrent
experiments each estimate their own effect?

Simulated experiments on the simulator's users (simulator.experiment_users: the world's taste
clusters and activity, its click model, its impressions per active day), users joining over `--days`
days and coming back on later ones, each user's clicks before the experiment as the CUPED covariate.
The plan: detect a `--lift` relative CTR lift at alpha 0.05 with 80% power; its users per arm are the
platform's own sample-size figure (engines.experimentation.sequential.users_per_arm) from a pilot A/A of another seed.
Then, on the same runs, the platform's test beside what simpler analyses give:

- group sequential (the platform): pooled days, CUPED, alpha spent over the planned information;
- mSPRT: pooled days, CUPED, the always-valid p-value;
- fixed horizon: pooled days, one z-test at the last day only;
- pooled z daily: pooled days, a z-test every day (peeking);
- newest-day z: each day's rows alone, a z-test every day (the per-day comparison);
- and without attribution (every answer that showed a clicked item credited, engines.experimentation.attribution's rule
  replaced): the group sequential test, and the per-day t-test every day (the old online table).

The CTR difference at the last look, over the runs, against the simulator's known effect: credited once
and credited to every answer.

The sample-ratio check (chi-square, p < 0.001) on an injected imbalance at 100,000 users: on one day of
them, on each day's users alone and on the pooled days. Twenty concurrent experiments in layers
(simulator.concurrent_experiments), each arm's estimate against its known effect, beside the
same users under the rule layers replaced (the first experiment assigning a non-control variant answers).

    .venv/bin/python benchmarks/experiments.py                    # 1,000 runs per proof, a 2% lift
    .venv/bin/python benchmarks/experiments.py --runs 200 --lift 0.05
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.experimentation.online_accuracy import AccuracySettings, srm_test  # noqa: E402
from engines.experimentation.sequential import users_per_arm  # noqa: E402
from simulator import concurrent_experiments  # noqa: E402
from simulator.experiment_users import (  # noqa: E402
    METRICS,
    Plan,
    Population,
    pooled_effects,
    rejections,
    simulate,
)

METHODS = {
    "group_sequential": "group sequential (platform)",
    "msprt": "mSPRT always-valid",
    "fixed_horizon": "fixed horizon, last day only",
    "pooled_daily_z": "pooled z-test every day",
    "newest_day_z": "newest day's z-test every day",
    "naive_group_sequential": "group sequential, every answer credited",
    "naive_newest_day_z": "per-day t-test, every answer credited",
}
NAIVE = ("group_sequential", "newest_day_z")  # the methods also run without attribution
ALIKE, RESHOWN = (0.1, 0.1), (0.1, 0.2)  # P(an item is shown again in a later answer): control, treatment
CHUNK = 50  # experiments simulated at once


def sample_size(population: Population, plan: Plan, days: int, seed: int) -> int:
    """The platform's sample-size figure for the plan, from a pilot A/A of 20 runs showing as the A/B."""
    pilot = pooled_effects(simulate(population, 20, 4_000, days, np.random.default_rng(seed), reshown=RESHOWN))
    variances = (float(np.mean(pilot.control_variance[:, -1])), float(np.mean(pilot.variant_variance[:, -1])))
    return users_per_arm(variances, plan.effect, plan.alpha, plan.power)


def run(population, plan, users, days, runs, lift, seed, reshown):
    """Per method the share of runs that rejected; per metric the plain and CUPED estimates at the end,
    and CTR's plain estimate with every answer credited ("naive")."""
    rng, found = np.random.default_rng(seed), {m: 0 for m in METHODS}
    estimates = {m: {"plain": [], "cuped": [], "control": [], "reduction": [], "naive": []} for m in METRICS}
    for start in range(0, runs, CHUNK):
        experiments = simulate(population, min(CHUNK, runs - start), 2 * users, days, rng, lift=lift, reshown=reshown)
        for method, rejected in rejections(experiments, plan).items():
            found[method] += int(rejected.sum())
        naive = experiments.crediting_every_answer()
        naive_rejections = rejections(naive, plan)
        for method in NAIVE:
            found[f"naive_{method}"] += int(naive_rejections[method].sum())
        estimates["ctr"]["naive"].extend(pooled_effects(naive, "ctr").difference[:, -1])
        for metric in METRICS:
            effect = pooled_effects(experiments, metric)
            estimates[metric]["plain"].extend(effect.difference[:, -1])
            estimates[metric]["cuped"].extend(effect.cuped_difference[:, -1])
            estimates[metric]["control"].extend(effect.control_value[:, -1])
            estimates[metric]["reduction"].extend(effect.variance_reduction[:, -1])
    arrays = {metric: {k: np.array(v) for k, v in e.items()} for metric, e in estimates.items()}
    return {m: n / runs for m, n in found.items()}, arrays


def binomial_interval(rate: float, runs: int) -> str:
    half = 1.96 * math.sqrt(max(rate * (1 - rate), 1e-9) / runs)
    return f"{rate:6.1%}  [{max(rate - half, 0):.1%}, {min(rate + half, 1):.1%}]"


def print_rates(columns: dict[str, dict[str, float]], runs: int) -> None:
    """One row per method, one column per set of runs: the share of runs that rejected."""
    print(f"\nshare of {runs:,} runs rejecting at any of the daily looks, 95% interval")
    print(f"  {'method, on the same runs':42s}" + "".join(f" {title:>24s}" for title in columns))
    for method, label in METHODS.items():
        cells = (binomial_interval(rates[method], runs) for rates in columns.values())
        print(f"  {label:42s}" + "".join(f" {cell:>24s}" for cell in cells))


def print_bias(estimates: dict[str, dict], truths: dict[str, float]) -> None:
    """The CTR difference at the last look, mean over the runs +- its 95% half-width, against the
    simulator's known effect, credited once (the platform) and to every answer that showed the item."""
    print("\nCTR difference at the last look against the known effect, mean over the runs +- 95%")
    for rule, label in (("plain", "attribution (platform)"), ("naive", "every answer credited")):
        line = f"  {label:24s}"
        for title, e in estimates.items():
            values, truth = np.asarray(e["ctr"][rule]), truths[title]
            half = 1.96 * np.std(values) / math.sqrt(len(values))
            held = "holds it" if abs(np.mean(values) - truth) <= half else "misses it"
            line += f"  {title}: known {truth:+.5f}, {np.mean(values):+.5f} +- {half:.5f} ({held})"
        print(line)


IMBALANCES = (  # the control arm's true share of users, configured 50/50
    ("as configured (false alarms)", 0.5),
    ("1% imbalance: 51/49", 0.51),
    ("half of that: 50.5/49.5", 0.505),
    ("treatment loses 1% of its users", 0.5 / 0.995),
)


def srm_rates(runs: int, users: int, days: int, seed: int) -> None:
    """How often the platform's chi-square check (p < 0.001) flags an experiment of `users` users split
    50/50 with an injected imbalance: all of them on one day; the same users arriving over `days` days,
    checked on each day's users alone and on the pooled days (as the asset checks both)."""
    rng, settings = np.random.default_rng(seed), AccuracySettings()
    split = {"control": 0.5, "treatment": 0.5}

    def flagged(control: int, total: int) -> bool:
        return srm_test("e", {"control": control, "treatment": total - control}, split, settings)["mismatch"]

    print(
        f"\nsample-ratio check at p < {settings.srm_alpha}, {runs:,} experiments of {users:,} users configured 50/50: "
        f"share flagged\n  {'injected':34s} {'one day':>10s} {f'{days} days, each day':>20s} {'pooled days':>12s}"
    )
    for label, share in IMBALANCES:
        one_day, per_day, pooled = 0, 0, 0
        for _ in range(runs):
            one_day += flagged(int(rng.binomial(users, share)), users)
            arrivals = rng.multinomial(users, [1 / days] * days)
            controls = rng.binomial(arrivals, share)
            per_day += any(flagged(int(c), int(n)) for c, n in zip(controls, arrivals))
            pooled += any(flagged(int(c), int(n)) for c, n in zip(np.cumsum(controls), np.cumsum(arrivals)))
        print(f"  {label:34s} {one_day / runs:10.1%} {per_day / runs:20.1%} {pooled / runs:12.1%}")


def concurrent(seeds: int, first: int) -> None:
    """Proof (4): twenty concurrent experiments in layers, each arm's estimate against its known effect,
    beside the same users and effects under the rule layers replaced (the first experiment that assigns
    a non-control variant answers), both analysed with a plain two-sample t-test per arm."""
    runs = [concurrent_experiments.simulate(seed) for seed in range(first, first + seeds)]
    arms = len(runs[0]["effects"])
    print(
        f"\ntwenty concurrent experiments on the recommend request ({arms} treatment arms in "
        f"{len(concurrent_experiments.LAYERS)} layers), {seeds} runs of {concurrent_experiments.USERS:,} users"
        f"\n  {'assignment':26s} {'95% coverage':>13s} {'relative error':>22s} {'arms unbiased':>14s}"
        f" {'median |z|':>11s}"
    )
    for method, label in (("layers", "layers (platform)"), ("first_wins", "first wins (old rule)")):
        cover, z, relative, unbiased = [], [], [], 0
        for version in runs[0]["effects"]:
            estimates = [next(e for key, e in run[method].items() if key[1] == version) for run in runs]
            truths = [run["effects"][version] for run in runs]
            cover += [concurrent_experiments.covered(e, t) for e, t in zip(estimates, truths)]
            z += [(e[0] - t) / e[1] for e, t in zip(estimates, truths)]
            errors = np.array([(e[0] - t) / t for e, t in zip(estimates, truths)])  # relative to the effect
            relative += errors.tolist()
            unbiased += abs(errors.mean()) <= 1.96 * errors.std(ddof=1) / math.sqrt(len(errors))
        half = 1.96 * np.std(relative) / math.sqrt(len(relative))
        print(
            f"  {label:26s} {np.mean(cover):13.1%} {np.mean(relative):+10.1%} +- {half:.1%} {unbiased:>8d} of {arms}"
            f" {np.median(np.abs(z)):11.2f}"
        )
    print(
        "  (relative error: (estimate - effect) / effect, mean over arms and runs; arms unbiased: the arm's mean "
        "relative error over the runs lies within its 95% interval; median |z|: 0.67 for a unit normal)"
    )


def print_cuped(estimates: dict, lift: float) -> None:
    """Per metric: the variance of the estimate over the runs, CUPED against plain, beside the squared
    correlation of the metric with the covariate (CUPED removes about that share); each estimate's
    mean against the known effect, and the mean of CUPED's adjustment (CUPED - plain, paired by run).
    The known effect on clicks per user is the lift times the treatment's extra showings."""
    print("\nCUPED at the last look (covariate: each user's clicks in the 14 days before), the A/B runs")
    relative = {"ctr": lift, "clicks_per_user": (1 + lift) * (1 + RESHOWN[1]) / (1 + RESHOWN[0]) - 1}
    for metric, e in estimates.items():
        truth = relative[metric] * float(np.mean(e["control"]))
        removed = 1 - np.var(e["cuped"]) / np.var(e["plain"])
        print(f"  {metric}: variance removed {removed:.1%}, squared correlation {np.mean(e['reduction']):.1%}")
        line = f"    known effect {truth:.3g}"
        for name, values in (("plain", e["plain"]), ("CUPED", e["cuped"]), ("CUPED - plain", e["cuped"] - e["plain"])):
            half = 1.96 * np.std(values) / math.sqrt(len(values))
            line += f"; {name} mean {np.mean(values):+.3g} +- {half:.2g}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--lift", type=float, default=0.02, help="relative CTR lift the plan is sized for")
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--layer-runs", type=int, default=20, help="runs of the twenty concurrent experiments")
    args = parser.parse_args()
    began = time.perf_counter()
    population = Population.of_world()
    plan = Plan(effect=args.lift * population.mean_click_probability)
    users = sample_size(population, plan, args.days, args.seed + 1)
    print(
        f"{len(population.activity):,} simulator users, CTR {population.mean_click_probability:.4f}; plan: a "
        f"{args.lift:.0%} relative lift ({plan.effect:.5f} absolute) at alpha {plan.alpha}, power {plan.power:.0%}"
        f"\nsample-size figure: {users:,} users per arm; {args.runs:,} runs of {2 * users:,} users, {args.days} days"
    )
    alike, _ = run(population, plan, users, args.days, args.runs, 0.0, args.seed + 2, ALIKE)
    null, null_estimates = run(population, plan, users, args.days, args.runs, 0.0, args.seed + 6, RESHOWN)
    found, estimates = run(population, plan, users, args.days, args.runs, args.lift, args.seed + 3, RESHOWN)
    print(
        f"\nA/A: no effect, {args.days} daily looks at alpha {plan.alpha}; each item shown again in a later answer "
        f"with P {ALIKE[0]} in both arms, or {RESHOWN[0]} and {RESHOWN[1]} in the treatment; A/B: a {args.lift:.0%} "
        f"lift, re-shown as the second A/A, power promised {plan.power:.0%}"
    )
    print_rates({"A/A, re-shown alike": alike, "A/A, treatment re-shows": null, "A/B: power": found}, args.runs)
    print_bias({"A/A": null_estimates, "A/B": estimates}, {"A/A": 0.0, "A/B": plan.effect})
    srm_rates(args.runs, 100_000, args.days, args.seed + 4)
    print_cuped(estimates, args.lift)
    concurrent(args.layer_runs, args.seed + 5)
    print(f"\n{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
