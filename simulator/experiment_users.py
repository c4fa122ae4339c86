"""Simulated online experiments on the simulator's users, for the proofs of the experiment statistics
(tests/engines/test_sequential.py, benchmarks/experiments.py). Vectorised: one call draws hundreds of
experiments of thousands of users over days, with a known effect or none.

The users are the world's (`World`): each keeps the taste cluster and the activity the simulator gave
them. A user's click probability is what the simulator's click model gives their cluster on the items
its feed shows (`click_logit` averaged over the catalogue, weighted as the feed weighs items: popular
items and the cluster's categories more). On a day a user is active, the feed shows them
Poisson(impressions_per_user_day x activity) items, each clicked with that probability, times
(1 + lift) in the variant arm. Users join the experiment on a uniformly drawn day (their first active
day in it), then come back on a day with the simulator's daily_active_fraction. Each user's clicks in
the `pre_days` days before the experiment, drawn the same way without lift, are the pre-experiment
covariate CUPED uses. The arm is a fair coin per user (or `variant_share`).

Answers re-show items: a user's session is several answers whose lists overlap, and each item shown
reappears in one later answer of the session with the arm's `reshown` probability (none by default).
Every showing is clicked with the user's probability, the click landing before the next answer, within
the horizon. `hits` credits each click once (engines.experimentation.attribution: the last answer that showed the item
before it); `naive_hits` credits every answer that showed the item before a click of it, so a click
after the second showing counts for both answers (CREDITED holds both rules per pattern of clicks)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from engines.experimentation.sequential import Arm, crossed, information_fraction, look, ratio_effect, running_minimum

from .config import SimulatorConfig
from .events import IMPRESSION_AFFINITY, click_logit
from .world import World


@dataclass(frozen=True)
class Population:
    """The world's users as an experiment sees them: per user, P(click | shown) and activity."""

    click_probability: np.ndarray
    activity: np.ndarray
    daily_active: float
    impressions_per_day: float

    @classmethod
    def of_world(cls, config: SimulatorConfig | None = None) -> Population:
        config = config or SimulatorConfig()
        world = World(config)
        users, items = world.at(0)[0].users, world.at(0)[0].items
        affinity = world.cluster_affinity  # cluster x category
        category, popularity = items.category_idx.to_numpy(), items.pop_z.to_numpy()
        feed = np.exp(1.5 * popularity) * affinity[:, category] ** IMPRESSION_AFFINITY  # as the feed weighs
        clicks = 1 / (1 + np.exp(-click_logit(np.log(affinity[:, category]), popularity)))
        per_cluster = (feed * clicks).sum(axis=1) / feed.sum(axis=1)
        return cls(
            per_cluster[users.taste_cluster.to_numpy()],
            users.activity.to_numpy(),
            config.daily_active_fraction,
            config.impressions_per_user_day,
        )

    @property
    def mean_click_probability(self) -> float:
        """The population's CTR (impressions weigh by activity)."""
        return float(np.average(self.click_probability, weights=self.activity))


@dataclass(frozen=True)
class Experiments:
    """`runs` experiments of `users` users over `days` days (arrays: runs x days x users, runs x users)."""

    hits: np.ndarray  # clicks per user and day, each credited to one answer
    shown: np.ndarray  # impressions per user and day (an item re-shown in a later answer counts twice)
    pre_hits: np.ndarray  # clicks in the pre_days days before the experiment
    first_day: np.ndarray  # the day a user joined (their first exposure)
    in_variant: np.ndarray  # the user's arm
    naive_hits: np.ndarray  # answers credited when every answer that showed a clicked item is

    def crediting_every_answer(self) -> Experiments:
        """The same experiments analysed without attribution: a hit per answer that showed a clicked item."""
        return replace(self, hits=self.naive_hits)

    def cumulative(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per look (the end of each day): each user's hits and shown so far, and who has joined."""
        days = self.hits.shape[1]
        joined = self.first_day[:, None, :] <= np.arange(days)[None, :, None]
        return self.hits.cumsum(axis=1), self.shown.cumsum(axis=1), joined


def simulate(
    population: Population,
    runs: int,
    users: int,
    days: int,
    rng: np.random.Generator,
    lift: float = 0.0,
    variant_share: float = 0.5,
    pre_days: int = 14,
    reshown: tuple[float, float] = (0.0, 0.0),
) -> Experiments:
    """Draw `runs` experiments; the variant multiplies every user's click probability by 1 + `lift`, and
    each shown item reappears in a later answer with probability `reshown` (control, variant)."""
    picked = rng.integers(0, len(population.activity), size=(runs, users))
    probability, activity = population.click_probability[picked], population.activity[picked]
    in_variant = rng.random((runs, users)) < variant_share
    first_day = rng.integers(0, days, size=(runs, users))
    day = np.arange(days)[None, :, None]
    active = (day == first_day[:, None, :]) | (
        (day > first_day[:, None, :]) & (rng.random((runs, days, users)) < population.daily_active)
    )
    rate = population.impressions_per_day * activity[:, None, :]
    items = np.where(active, rng.poisson(np.broadcast_to(rate, active.shape)), 0).astype(np.int32)
    treated = np.broadcast_to((probability * np.where(in_variant, 1 + lift, 1.0))[:, None, :], items.shape)
    shown, hits, naive_hits = _showings(items, treated, np.where(in_variant, reshown[1], reshown[0])[:, None, :], rng)
    pre_shown = rng.poisson(population.impressions_per_day * population.daily_active * pre_days * activity)
    pre_hits = rng.binomial(pre_shown, probability)
    return Experiments(hits, shown, pre_hits.astype(float), first_day, in_variant, naive_hits)


# An item shown twice, by which of its two showings were clicked -> the hits each rule credits: a click
# goes to the last answer that showed the item before it, where crediting every answer that showed it
# before the click counts a click after the second showing for both answers.
PATTERNS = ("first", "second", "both")
CREDITED = {"attributed": (1, 1, 2), "naive": (1, 2, 2)}


def _showings(items, probability, reshown, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per user and day: impressions, hits credited once, hits credited to every answer. `items` distinct
    items shown, each again in a later answer with probability `reshown`, each showing clicked with
    `probability`. Without re-showing the draws are those of one showing per item."""
    if not np.any(reshown):
        hits = rng.binomial(items, probability).astype(np.int32)
        return items, hits, hits
    twice = rng.binomial(items, np.broadcast_to(reshown, items.shape))
    once = items - twice
    hits = rng.binomial(once, probability)
    naive = hits.copy()
    left, remaining = twice, 1.0  # the multinomial over PATTERNS, one binomial at a time
    chances = (probability * (1 - probability), probability * (1 - probability), probability**2)
    for credited, naively, chance in zip(CREDITED["attributed"], CREDITED["naive"], chances):
        drawn = rng.binomial(left, np.clip(chance / remaining, 0, 1))
        hits += credited * drawn
        naive += naively * drawn
        left, remaining = left - drawn, remaining - chance
    return (items + twice).astype(np.int32), hits.astype(np.int32), naive.astype(np.int32)


METRICS = ("ctr", "clicks_per_user")  # hits / shown, and hits per user (denominator 1)


def _arms(hits, shown, covariate, present, in_variant, metric: str):
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, not {metric!r}")
    denominator = shown if metric == "ctr" else np.ones_like(hits)
    return tuple(Arm.of(hits, denominator, covariate, present & side) for side in (~in_variant, in_variant))


def pooled_effects(experiments: Experiments, metric: str = "ctr"):
    """The effect at each look (runs x days): every user who joined so far, with all their days so far."""
    hits, shown, joined = experiments.cumulative()
    covariate = np.broadcast_to(experiments.pre_hits[:, None, :], hits.shape)
    in_variant = np.broadcast_to(experiments.in_variant[:, None, :], hits.shape)
    return ratio_effect(*_arms(hits, shown, covariate, joined, in_variant, metric))


def daily_effects(experiments: Experiments, metric: str = "ctr"):
    """The effect of each day alone (runs x days): the users active that day, that day's rows only, as
    a per-day comparison that is never pooled reads them."""
    active = experiments.shown > 0
    in_variant = np.broadcast_to(experiments.in_variant[:, None, :], active.shape)
    return ratio_effect(*_arms(experiments.hits, experiments.shown, None, active, in_variant, metric))


@dataclass(frozen=True)
class Plan:
    """What an experiment is sized for: an absolute `effect` at `alpha` with `power`."""

    effect: float
    alpha: float = 0.05
    power: float = 0.8
    minimum_users: int = 100


def rejections(experiments: Experiments, plan: Plan, metric: str = "ctr") -> dict[str, np.ndarray]:
    """Per run, whether each method rejected "no difference" at any of the daily looks:
    - group_sequential: the platform's test: pooled days, CUPED, alpha spent over the planned information;
    - msprt: pooled days, CUPED, the always-valid mSPRT p-value;
    - fixed_horizon: pooled days, one z-test at the last look only (the planned horizon);
    - pooled_daily_z: pooled days, a z-test at every look (peeking);
    - newest_day_z: each day's rows alone, a z-test every day (the per-day comparison)."""
    pooled = pooled_effects(experiments, metric)
    ours = look(pooled, plan.effect, plan.alpha, plan.power, plan.minimum_users)
    daily = look(daily_effects(experiments, metric), plan.effect, plan.alpha, plan.power, plan.minimum_users)
    reached = information_fraction(pooled.cuped_se, plan.effect, plan.alpha, plan.power)
    information = np.where(ours.tested, reached, np.nan)
    z = pooled.cuped_difference / pooled.cuped_se
    below = lambda p: np.nan_to_num(p, nan=1.0) < plan.alpha  # noqa: E731 - an untested look rejects nothing
    return {
        "group_sequential": crossed(z, information, plan.alpha)[:, -1],
        "msprt": below(running_minimum(ours.p_value, axis=1)[:, -1]),
        "fixed_horizon": below(ours.fixed_p_value[:, -1]),
        "pooled_daily_z": below(ours.fixed_p_value).any(axis=1),
        "newest_day_z": below(daily.fixed_p_value).any(axis=1),
    }
