"""Online accuracy: how served recommendations did on the outcomes that followed them. Plain Python.

A logged answer (engines.experimentation.prediction_logs) showed the user its top k items at `served_at`; a shown item
is a hit when a click or play of it (warehouse interactions) is credited to the answer. Each outcome is
credited to at most one answer (`credited_outcomes`): the one whose request id the interaction echoes,
else the last that showed the item to the user within `horizon` before it; crediting every answer that
showed the item counted one click two or three times, more often in the arm that repeats its lists.
Per group of answers (model version, served entry, variant, role):
- CTR@k = hits / items shown (a ratio over users: its interval is the delta method over users, the
  unit experiments randomize);
- NDCG@k with binary relevance, the ideal order being the answer's hits first; averaged over answers;
each with a normal interval at `confidence`. No calibration figure: the served score is trained against
random catalogue items, so its sigmoid estimates exposure, not the chance of a click, and observed over
"expected" clicks would measure nothing.

Per experiment (intent to treat: every live answer counts for the variant its user was assigned in
that experiment, whichever experiment decided who answered), on the pooled days of the experiment
(`experiment_users` rows of every day so far, one look per day): each variant against the control on
CTR@k, NDCG@k and hits per user, the plain and the CUPED estimate (covariate: each user's outcomes
before the experiment), a group-sequential test that spends `alpha` over the information the plan
needs (engines.experimentation.sequential), Holm's adjustment over the experiment's variants and metrics, and the
sample-size figure: the users per arm one look needs to detect a `minimum_effect` relative lift at
`alpha` with `power`, and the users still missing. Where an arm has fewer than `minimum_users` users,
no p-value, interval or significance is published and `test` says why. Each arm's served-version mix
(`*_version_mix`: answers per model version) shows an arm another experiment's variant answered.

Sample-ratio mismatch: per experiment, the users assigned to each arm against the configured split, a
chi-square goodness-of-fit test, on the day's logs (`sample_ratio`) and on the pooled days its test reads
(`pooled_sample_ratio`); p < `srm_alpha` means the assignment or the logging is broken and no comparison
of that experiment can be trusted.

Shadows are scored counterfactually, on the outcomes credited to the live answer of their request: an
item the live model did not show never counts, so the estimate always favours the live model and no
significance test of it means anything. Shadow against live (requests where the live version differs
from the shadow's) publishes agreement instead: overlap@k, rank correlation and score shift."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import date, datetime, timedelta

import numpy as np
import polars as pl
from scipy.special import chdtrc
from scipy.stats import kendalltau, norm

from engines.data.lake import Lake
from engines.experimentation import attribution, sequential
from engines.experimentation.prediction_logs import LIVE, OK, SHADOW

OUTCOMES = ("click", "play")
ECHO = "session_id"  # an interaction's column where a client echoes the request id of the answer it acted on
ZONE, MODELS_TABLE, COMPARISONS_TABLE = "monitoring", "online_accuracy", "online_comparisons"  # in the lake


@dataclass(frozen=True)
class AccuracySettings:
    k: int = 10
    horizon: timedelta = timedelta(hours=1)
    outcomes: tuple[str, ...] = OUTCOMES
    confidence: float = 0.95
    alpha: float = 0.05
    power: float = 0.8
    minimum_effect: float = 0.05  # relative CTR lift a test is sized to detect
    minimum_users: int = 100  # per arm: below it no test is run (its normal approximation does not hold)
    srm_alpha: float = 0.001  # a sample-ratio mismatch below this p-value blocks
    cuped_days: int = 14  # days before an experiment's first day whose outcomes are the CUPED covariate

    @property
    def z(self) -> float:
        return float(norm.ppf(1 - (1 - self.confidence) / 2))


@dataclass(frozen=True)
class Ratio:
    """Σ numerator / Σ denominator over units (users), with its delta-method standard error."""

    value: float
    se: float
    units: int

    @classmethod
    def of(cls, numerators: np.ndarray, denominators: np.ndarray) -> Ratio:
        units, total = len(numerators), float(np.sum(denominators))
        if units == 0 or total == 0:
            return cls(math.nan, math.nan, units)
        value = float(np.sum(numerators)) / total
        if units < 2:
            return cls(value, math.nan, units)
        residual = numerators - value * denominators
        se = math.sqrt(float(np.var(residual, ddof=1)) / units) / (total / units)
        return cls(value, se, units)

    def interval(self, z: float) -> tuple[float, float]:
        return self.value - z * self.se, self.value + z * self.se


# --- per answer ------------------------------------------------------------------------------------------
def scored_answers(logs: pl.DataFrame, interactions: pl.DataFrame, settings: AccuracySettings) -> pl.DataFrame:
    """One row per recommend answer that succeeded: its hits, items shown, and NDCG at k. A
    shown item is a hit when an outcome of it is credited to the answer's request (`credited_outcomes`):
    a live answer counts what it caused, a shadow what the live answer of its request caused."""
    answers = _recommended(logs).with_row_index("answer")
    shown = _shown(answers)
    credited = credited_outcomes(logs, interactions, settings)
    hits = credited.select("request_id", "item_id").unique().with_columns(pl.lit(1).alias("hit"))
    shown = (
        shown.filter(pl.col("rank") <= settings.k)
        .join(hits, on=["request_id", "item_id"], how="left")
        .with_columns(pl.col("hit").fill_null(0))
    )
    per_answer = shown.group_by("answer").agg(
        pl.col("hit").sum().alias("hits"),
        pl.len().alias("shown"),
        (pl.col("hit") / (pl.col("rank") + 1).log(2)).sum().alias("dcg"),
    )
    answers = answers.join(per_answer, on="answer", how="left").with_columns(
        pl.col("hits").fill_null(0),
        pl.col("shown").fill_null(0),
        pl.col("dcg").fill_null(0.0),
    )
    ideal = pl.DataFrame(
        {
            "hits": range(settings.k + 1),
            "idcg": [sum(1 / math.log2(r + 1) for r in range(1, h + 1)) for h in range(settings.k + 1)],
        },
        schema={"hits": answers.schema["hits"], "idcg": pl.Float64},
    )
    return (
        answers.join(ideal, on="hits", how="left")
        .with_columns(pl.when(pl.col("hits") > 0).then(pl.col("dcg") / pl.col("idcg")).otherwise(0.0).alias("ndcg"))
        .drop("idcg")
    )


def with_complete_horizon(logs: pl.DataFrame, outcomes_until: datetime, horizon: timedelta) -> tuple[pl.DataFrame, int]:
    """The records whose horizon ends by `outcomes_until` (the end of the interactions taken in), and how
    many live recommend answers were left out: an answer whose horizon runs past the data would count its
    clicks as misses. Left out, they wait for the next day's interactions (a re-run of the day counts them);
    which answers wait depends on the time of day only, the same in every arm."""
    complete = pl.col("served_at") + horizon <= outcomes_until
    waiting = logs.filter(~complete & (pl.col("role") == LIVE) & (pl.col("endpoint") == "recommend")).height
    return logs.filter(complete), waiting


def _recommended(logs: pl.DataFrame) -> pl.DataFrame:
    return logs.filter((pl.col("endpoint") == "recommend") & (pl.col("status") == OK))


def _shown(answers: pl.DataFrame) -> pl.DataFrame:
    """One row per item of each answer's list (answers numbered in `answer`), with its rank (1 first)."""
    return (
        answers.select("answer", "request_id", "role", "user_id", "served_at", "item_ids", "scores")
        .explode("item_ids", "scores")
        .rename({"item_ids": "item_id", "scores": "score"})
        .drop_nulls("item_id")
        .with_columns(pl.int_range(1, pl.len() + 1).over("answer").alias("rank"))
    )


def credited_outcomes(logs: pl.DataFrame, interactions: pl.DataFrame, settings: AccuracySettings) -> pl.DataFrame:
    """Each outcome (a click or play in `interactions`) credited to at most one of the live answers in
    `logs` that showed its item to its user within `horizon` before it (a shadow's list was never seen),
    by the rule the training labels share (engines.experimentation.attribution): the answer whose request id the
    interaction echoes (in its `session_id`, where the data has one), else the last of them (ties: the
    greater request id). One row per credited outcome: `outcome` (its row number in `interactions`),
    request_id, user_id, item_id, at."""
    shown = _shown(_recommended(logs).filter(pl.col("role") == LIVE).with_row_index("answer"))
    exposures = shown.select(
        pl.col("request_id").alias("exposure"),
        "user_id",
        "item_id",
        pl.col("served_at").alias("shown_at"),
        pl.col("request_id").alias("key"),
    )
    echoed = pl.col(ECHO) if ECHO in interactions.columns else pl.lit(None, pl.String)
    events = (
        interactions.with_row_index("outcome")
        .filter(pl.col("event_type").is_in(list(settings.outcomes)))
        .select("outcome", "user_id", "item_id", pl.col("event_timestamp").alias("at"), echoed.alias("echoed"))
    )
    credited = attribution.credit(exposures, events, settings.horizon)
    return (
        credited.join(events.select("outcome", "user_id", "item_id", "at"), on="outcome")
        .select("outcome", pl.col("exposure").alias("request_id"), "user_id", "item_id", "at")
        .sort("outcome")
    )


def _per_user(answers: pl.DataFrame) -> pl.DataFrame:
    return answers.group_by("user_id").agg(
        pl.col("hits").sum(),
        pl.col("shown").sum(),
        pl.col("ndcg").sum(),
        pl.len().alias("answers"),
    )


def _metrics(users: pl.DataFrame, settings: AccuracySettings) -> dict:
    h, n = users["hits"].to_numpy().astype(float), users["shown"].to_numpy().astype(float)
    ctr = Ratio.of(h, n)
    ndcg = Ratio.of(users["ndcg"].to_numpy(), users["answers"].to_numpy().astype(float))
    row = {"users": users.height, "answers": int(users["answers"].sum()), "shown": int(n.sum()), "hits": int(h.sum())}
    for name, ratio in (("ctr", ctr), ("ndcg", ndcg)):
        low, high = ratio.interval(settings.z)
        row.update({name: ratio.value, f"{name}_low": low, f"{name}_high": high, f"{name}_se": ratio.se})
    return row


GROUP = ["role", "served_model", "registry_model", "model_version", "variant"]


def by_model(answers: pl.DataFrame, settings: AccuracySettings) -> pl.DataFrame:
    """CTR@k and NDCG@k with intervals per (role, entry, model version, variant)."""
    rows = []
    for key, group in answers.group_by(GROUP, maintain_order=True):
        metrics = _metrics(_per_user(group), settings)
        rows.append({**dict(zip(GROUP, key)), "counterfactual": key[0] == SHADOW, **metrics})
    return pl.DataFrame(rows).sort(GROUP) if rows else pl.DataFrame()


# --- experiments -----------------------------------------------------------------------------------------
EXPERIMENT_USERS_TABLE = "experiment_users"  # per day: each experiment's users, arm and what they did
METRICS = {  # per experiment: each metric a ratio of per-user sums (numerator, denominator)
    "ctr": ("hits", "shown"),  # the primary metric: promotion evidence reads it
    "ndcg": ("ndcg", "answers"),
    "hits_per_user": ("hits", "one"),
}
PRIMARY = "ctr"


def experiment_users(answers: pl.DataFrame, day: date) -> pl.DataFrame:
    """One row per experiment, arm, user, model version and experiments file (the digest that routed the
    answers) of the day's live answers (intent to treat: every live answer counts for the variant its
    user was assigned in each experiment): hits, items shown, NDCG summed over answers, answers. The rows
    of every day of an experiment pool into its test."""
    live = answers.filter(pl.col("role") == LIVE)
    assigned = [json.loads(a or "{}") for a in live["assignments"].to_list()]
    long = (
        live.select("user_id", "model_version", "experiments_config", "hits", "shown", "ndcg")
        .with_columns(
            pl.Series("experiment", [list(a) for a in assigned], dtype=pl.List(pl.String)),
            pl.Series("arm", [list(a.values()) for a in assigned], dtype=pl.List(pl.String)),
        )
        .explode("experiment", "arm")
        .drop_nulls("experiment")
    )
    return (
        long.group_by("experiment", "arm", "user_id", "model_version", "experiments_config")
        .agg(pl.col("hits").sum(), pl.col("shown").sum(), pl.col("ndcg").sum(), pl.len().alias("answers"))
        .with_columns(pl.lit(day).alias("day"))
        .sort("experiment", "arm", "user_id", "model_version", "experiments_config", nulls_last=True)
    )


def pre_experiment(interactions: pl.DataFrame, settings: AccuracySettings) -> pl.DataFrame:
    """Each user's outcomes (clicks and plays) in `interactions`: the CUPED covariate, read from the
    days before an experiment's first day (behaviour the arm cannot have changed)."""
    return (
        interactions.filter(pl.col("event_type").is_in(list(settings.outcomes)))
        .group_by("user_id")
        .agg(pl.len().cast(pl.Float64).alias("pre"))
    )


def pooled_days(lake: Lake, day: date, today: pl.DataFrame) -> pl.DataFrame:
    """`today`'s experiment_users rows with those of every earlier stored day of the same experiments:
    the sample each experiment's test pools (an experiment is its name: a new one needs a new name)."""
    earlier = [d for d in lake.partition_days(ZONE, EXPERIMENT_USERS_TABLE) if d < day]
    scanned = lake.scan_partitions(ZONE, EXPERIMENT_USERS_TABLE, earlier)
    if scanned is None or today.is_empty():
        return today
    running = today["experiment"].unique().to_list()
    before = scanned.filter(pl.col("experiment").is_in(running)).collect()
    # diagonal: days stored before `experiments_config` was a column read it as null (the repository's file)
    return pl.concat([before, today], how="diagonal_relaxed").sort("experiment", "day", "arm", "user_id")


def covariates(lake: Lake, users: pl.DataFrame, settings: AccuracySettings) -> dict[str, pl.DataFrame]:
    """Per experiment, each user's outcomes in the `cuped_days` days of warehouse interactions before
    the experiment's first day (`pre_experiment`); experiments without any such day get none."""
    found = {}
    firsts = users.group_by("experiment").agg(pl.col("day").min().alias("first"))
    for (first,), group in firsts.group_by("first"):
        days = [first - timedelta(days=back) for back in range(1, settings.cuped_days + 1)]
        scanned = lake.scan_partitions("warehouse", "interactions", days)
        if scanned is None:
            continue
        pre = pre_experiment(scanned.select("user_id", "event_type").collect(), settings)
        found.update(dict.fromkeys(group["experiment"].to_list(), pre))
    return found


def by_experiment(
    users: pl.DataFrame,
    controls: dict[str, str],
    settings: AccuracySettings,
    covariates: dict[str, pl.DataFrame] | None = None,
) -> pl.DataFrame:
    """Each experiment's variants against its control on every metric, over the pooled days of the
    experiment (`users`: `experiment_users` rows of all its days so far), tested as a group-sequential
    test with one look per day (engines.experimentation.sequential), CUPED from `covariates` (experiment -> user_id,
    pre), Holm's adjustment over the experiment's variants and metrics."""
    rows = []
    for (experiment,), rows_of in users.group_by("experiment", maintain_order=True):
        arms = sorted(set(rows_of["arm"].to_list()))
        control = controls.get(experiment) or ("control" if "control" in arms else min(arms))
        if control not in arms:
            continue
        covariate = (covariates or {}).get(experiment)
        tested = [
            compare(experiment, control, variant, metric, rows_of, covariate, settings)
            for variant in arms
            if variant != control
            for metric in METRICS
        ]
        rows.extend(adjusted(tested, settings))
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def adjusted(rows: list[dict], settings: AccuracySettings) -> list[dict]:
    """Holm's adjustment over one experiment's tested rows (variants x metrics); untested rows are not
    in the family. Significant: the adjusted p-value below alpha."""
    p = sequential.holm([r["p_value"] if r["p_value"] is not None else math.nan for r in rows])
    family = sum(r["p_value"] is not None for r in rows)
    for row, value in zip(rows, p):
        tested = not math.isnan(value)
        row["adjusted_p_value"] = float(value) if tested else None
        row["significant"] = bool(tested and value < settings.alpha)
        if tested:
            row["test"] += f"; Holm over {family} tests"
    return rows


def _looks(rows: pl.DataFrame, arm: str, metric: str, covariate: pl.DataFrame | None, days: list) -> list:
    """The arm's users at each look (the end of each day of the experiment), pooled over the days so far."""
    numerator, denominator = METRICS[metric]
    mine, looks = rows.filter(pl.col("arm") == arm), []
    for day in days:
        pooled = (
            mine.filter(pl.col("day") <= day)
            .group_by("user_id")
            .agg(pl.col("hits", "shown", "ndcg", "answers").sum())
            .with_columns(pl.lit(1.0).alias("one"))
        )
        if covariate is not None:
            pooled = pooled.join(covariate, on="user_id", how="left").with_columns(pl.col("pre").fill_null(0.0))
        pre = pooled["pre"].to_numpy() if covariate is not None else None
        looks.append(sequential.Arm.of(pooled[numerator].to_numpy(), pooled[denominator].to_numpy(), pre))
    return looks


def compare(
    experiment: str,
    control: str,
    variant: str,
    metric: str,
    rows: pl.DataFrame,
    covariate: pl.DataFrame | None,
    settings: AccuracySettings,
) -> dict:
    """One variant against the control on one metric: the plain and CUPED difference at the newest look,
    the group-sequential test over the daily looks (p-value: the smallest level it has rejected at)."""
    days = sorted(set(rows.filter(pl.col("arm").is_in([control, variant]))["day"].to_list()))
    pairs = zip(_looks(rows, control, metric, covariate, days), _looks(rows, variant, metric, covariate, days))
    effects = [sequential.ratio_effect(c, v) for c, v in pairs]
    last = effects[-1]
    planned = settings.minimum_effect * float(last.control_value)
    looks = [sequential.look(e, planned, settings.alpha, settings.power, settings.minimum_users) for e in effects]
    row = _described(experiment, control, variant, metric, rows, days, last, settings)
    if not looks[-1].tested:
        small = _too_few(control, int(last.control_users), variant, int(last.variant_users), settings.minimum_users)
        return {**row, "test": small or "not tested: no variance between users"}
    return {
        **row,
        **_sequential_test(effects, looks, planned, settings),
        "test": f"group sequential, {len(days)} looks",
    }


TEST_COLUMNS = (  # None where no test is run
    "difference_low",
    "difference_high",
    "cuped_low",
    "cuped_high",
    "information",
    "fixed_p_value",
    "always_valid_p_value",
    "p_value",
    "adjusted_p_value",
)


def _described(experiment, control, variant, metric, rows, days, effect, settings) -> dict:
    """What a row states whether or not it is tested: the arms, their users and values, the estimates,
    and the sample-size figure (users per arm a single look needs for `minimum_effect` at `power`)."""
    planned = settings.minimum_effect * float(effect.control_value)
    variances = (float(effect.control_variance), float(effect.variant_variance))
    needed = sequential.users_per_arm(variances, planned, settings.alpha, settings.power)
    users = (int(effect.control_users), int(effect.variant_users))
    return {
        "experiment": experiment,
        "control": control,
        "variant": variant,
        "metric": metric,
        "control_versions": ",".join(sorted(set(rows.filter(pl.col("arm") == control)["model_version"].to_list()))),
        "variant_versions": ",".join(sorted(set(rows.filter(pl.col("arm") == variant)["model_version"].to_list()))),
        "control_version_mix": version_mix(rows.filter(pl.col("arm") == control)),
        "variant_version_mix": version_mix(rows.filter(pl.col("arm") == variant)),
        "first_day": str(days[0]),
        "looks": len(days),
        "control_users": users[0],
        "variant_users": users[1],
        "control_value": float(effect.control_value),
        "variant_value": float(effect.variant_value),
        "difference": float(effect.difference),
        "cuped_difference": float(effect.cuped_difference),
        "variance_reduction": float(effect.variance_reduction) if effect.se > 0 else None,
        **dict.fromkeys(TEST_COLUMNS),
        "significant": False,
        "users_needed_per_arm": needed,
        "users_still_needed": max(0, needed - min(users)) if needed is not None else None,
        "counterfactual": False,
    }


def _sequential_test(effects: list, looks: list, planned: float, settings: AccuracySettings) -> dict:
    """The group-sequential test of the CUPED estimate over the looks (alpha spent by the information
    reached), its repeated confidence intervals (the newest look's boundary, around the plain and the
    CUPED estimate), the fixed-horizon p-value of the newest look and the mSPRT's always-valid p-value."""
    tested = np.array([bool(look.tested) for look in looks])
    se = np.array([float(e.cuped_se) for e in effects])
    z = np.where(tested, np.array([float(e.cuped_difference) for e in effects]) / se, np.nan)
    information = np.where(tested, sequential.information_fraction(se, planned, settings.alpha, settings.power), np.nan)
    _, limits = sequential.boundaries(z, information, settings.alpha)
    finite = limits[np.isfinite(limits)]
    boundary = float(finite[-1]) if finite.size else math.inf  # after the plan: the last look's boundary
    last = effects[-1]
    bounded = math.isfinite(boundary)  # not when no look spent alpha (a control without hits plans no effect)
    return {
        "difference_low": float(last.difference - boundary * last.se) if bounded else None,
        "difference_high": float(last.difference + boundary * last.se) if bounded else None,
        "cuped_low": float(last.cuped_difference - boundary * last.cuped_se) if bounded else None,
        "cuped_high": float(last.cuped_difference + boundary * last.cuped_se) if bounded else None,
        "information": float(information[-1]),
        "fixed_p_value": float(looks[-1].fixed_p_value),
        "always_valid_p_value": float(np.nanmin([look.p_value for look in looks])),
        "p_value": float(sequential.repeated_p(z, information)),
    }


def shadow_against_live(answers: pl.DataFrame, settings: AccuracySettings) -> pl.DataFrame:
    """Each shadow version against each live version, on the same requests; a version against itself is
    left out (it agrees by construction and would dilute any difference; `same_version_pairs` counts it).
    A shadow's CTR is counterfactual: outcomes land only on what the live answer showed, so it favours the
    live model and no significance is claimed; what is published is how far the two agree (`agreement`)."""
    live = answers.filter(pl.col("role") == LIVE).select(
        "request_id",
        pl.col("model_version").alias("live_version"),
        pl.col("item_ids").alias("live_items"),
        pl.col("scores").alias("live_scores"),
        pl.col("hits").alias("live_hits"),
        pl.col("shown").alias("live_shown"),
    )
    paired = answers.filter(pl.col("role") == SHADOW).join(live, on="request_id")
    is_same = pl.col("live_version") == pl.col("model_version")
    different = paired.filter(~is_same)
    same = dict(paired.filter(is_same).group_by("variant").len().iter_rows())  # shadow -> pairs left out
    rows = []
    for (shadow, version, live_version), pairs in different.group_by(
        ["variant", "model_version", "live_version"], maintain_order=True
    ):
        users = pairs.group_by("user_id").agg(pl.col("hits", "shown", "live_hits", "live_shown").sum())
        rl = Ratio.of(users["live_hits"].to_numpy().astype(float), users["live_shown"].to_numpy().astype(float))
        rs = Ratio.of(users["hits"].to_numpy().astype(float), users["shown"].to_numpy().astype(float))
        rows.append(
            {
                "experiment": f"shadow:{shadow}",
                "control": "live",
                "variant": shadow,
                "control_versions": live_version,
                "variant_versions": version,
                "control_users": rl.units,
                "variant_users": rs.units,
                "metric": PRIMARY,
                "control_value": rl.value,
                "variant_value": rs.value,
                "difference": rs.value - rl.value,
                "significant": False,
                "counterfactual": True,
                "pairs": pairs.height,
                "same_version_pairs": same.get(shadow, 0),
                **agreement(pairs, settings.k),
            }
        )
    return pl.DataFrame(rows).sort("experiment", "control_versions", "variant_versions") if rows else pl.DataFrame()


def agreement(pairs: pl.DataFrame, k: int) -> dict[str, float]:
    """How far a shadow's lists agree with the live ones of the same requests, averaged over the pairs:
    overlap@k (shared items among the top k, over the longer list's), rank correlation (Kendall's tau
    of the shared items' ranks, over pairs sharing two or more) and score shift (the shadow's mean score
    at k minus the live one's)."""
    overlaps, taus, shifts = [], [], []
    for shadow_items, live_items, shadow_scores, live_scores in pairs.select(
        "item_ids", "live_items", "scores", "live_scores"
    ).iter_rows():
        top_s, top_l = shadow_items[:k], live_items[:k]
        shared = [item for item in top_l if item in top_s]
        overlaps.append(len(shared) / max(len(top_s), len(top_l), 1))
        if len(shared) >= 2:
            taus.append(kendalltau(range(len(shared)), [top_s.index(i) for i in shared]).statistic)
        if shadow_scores[:k] and live_scores[:k]:
            shifts.append(float(np.mean(shadow_scores[:k]) - np.mean(live_scores[:k])))
    return {
        "overlap_at_k": float(np.mean(overlaps)),
        "rank_correlation": float(np.mean(taus)) if taus else None,
        "score_shift": float(np.mean(shifts)) if shifts else None,
    }


def _too_few(control: str, control_users: int, variant: str, variant_users: int, minimum: int) -> str:
    """Why no test is run ("" when one is): an arm under `minimum` users."""
    arms = ((control, control_users), (variant, variant_users))
    small = [f"{arm} has {users} users" for arm, users in arms if users < minimum]
    return f"not tested: {' and '.join(small)}, fewer than {minimum}" if small else ""


def version_mix(rows: pl.DataFrame) -> str:
    """Which model versions answered an arm (`experiment_users` rows): "v2 900 (90.0%), v3 100 (10.0%)",
    answers per version, most first."""
    counts = (
        rows.group_by("model_version")
        .agg(pl.col("answers").sum())
        .sort(["answers", "model_version"], descending=[True, False])
    )
    total = int(rows["answers"].sum())
    return ", ".join(f"v{version} {n} ({n / total:.1%})" for version, n in counts.iter_rows())


# --- sample-ratio mismatch -------------------------------------------------------------------------------
def sample_ratio(logs: pl.DataFrame, splits: dict[str, dict[str, float]], settings: AccuracySettings) -> pl.DataFrame:
    """Per experiment in the logs' assignments: the users of live recommend requests assigned to each arm
    (a user counts once per arm, whether the answer succeeded or not) against `splits` (experiment ->
    variant -> traffic, the configured split), a chi-square goodness-of-fit test."""
    live = logs.filter((pl.col("role") == LIVE) & (pl.col("endpoint") == "recommend") & pl.col("user_id").is_not_null())
    users: dict[str, dict[str, set]] = {}
    for user, assigned in live.select("user_id", "assignments").unique().iter_rows():
        for experiment, variant in json.loads(assigned or "{}").items():
            users.setdefault(experiment, {}).setdefault(variant, set()).add(user)
    rows = [
        {"scope": "day", **srm_test(experiment, {v: len(u) for v, u in arms.items()}, splits.get(experiment), settings)}
        for experiment, arms in sorted(users.items())
    ]
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def pooled_sample_ratio(
    users: pl.DataFrame, splits: dict[str, dict[str, float]], settings: AccuracySettings
) -> pl.DataFrame:
    """`sample_ratio` over the pooled days of each experiment (`users`: experiment_users rows of every day
    so far, as the experiment's test pools them): each user once per arm. A small imbalance that one day's
    users cannot show builds up over the days; the test that reads those days must not miss it."""
    if users.is_empty():
        return pl.DataFrame()
    counts = users.group_by("experiment", "arm").agg(
        pl.col("user_id").n_unique().alias("users"),
        pl.col("day").min().alias("first"),
        pl.col("day").max().alias("last"),
    )
    rows = []
    for (experiment,), arms in counts.sort("experiment", "arm").group_by("experiment", maintain_order=True):
        scope = f"pooled {arms['first'].min()}..{arms['last'].max()}"
        tested = srm_test(experiment, dict(zip(arms["arm"], arms["users"])), splits.get(experiment), settings)
        rows.append({"scope": scope, **tested})
    return pl.DataFrame(rows)


def with_sample_ratio(comparisons: pl.DataFrame, ratios: pl.DataFrame) -> pl.DataFrame:
    """`comparisons` with `sample_ratio_mismatch`: whether any sample-ratio test of the row's experiment
    (the day's or the pooled days') found a mismatch. Shadow rows have no assignment to mismatch."""
    if comparisons.is_empty():
        return comparisons
    broken = set(ratios.filter(pl.col("mismatch"))["experiment"].to_list()) if ratios.height else set()
    return comparisons.with_columns(pl.col("experiment").is_in(list(broken)).alias("sample_ratio_mismatch"))


def config_uses(logs: pl.DataFrame, users: pl.DataFrame) -> list[tuple[str, str | None]]:
    """Each (experiment, experiments file digest) that routed a live recommend record of `logs` or an
    `experiment_users` row of `users`: which files' designs each experiment's analysis reads."""
    live = logs.filter((pl.col("role") == LIVE) & (pl.col("endpoint") == "recommend"))
    found = {
        (experiment, digest)
        for assigned, digest in live.select("assignments", "experiments_config").unique().iter_rows()
        for experiment in json.loads(assigned or "{}")
    }
    if not users.is_empty():
        found |= set(users.select("experiment", "experiments_config").unique().iter_rows())
    return sorted(found, key=lambda use: (use[0], use[1] or ""))


def design_conflicts(conflicts: dict[str, str]) -> pl.DataFrame:
    """Sample-ratio rows (blocking) for experiments whose served files disagree on their split or control
    (experiment -> why): no split to test against, and their pooled arms are not randomized groups."""
    rows = [
        {"scope": "served configs", "experiment": name, "mismatch": True, "test": f"not tested: {why}"}
        for name, why in sorted(conflicts.items())
    ]
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def srm_test(
    experiment: str, counts: dict[str, int], split: dict[str, float] | None, settings: AccuracySettings
) -> dict:
    """One experiment's users per arm (`counts`) against its configured `split`: chi-square, p-value and
    whether it is a mismatch at `srm_alpha`, or why it was not tested (no p-value then)."""
    total = sum(counts.values())
    reason = _untestable(counts, split, total)
    arms = list(split) if split else sorted(counts)
    observed = [counts.get(arm, 0) for arm in arms]
    chi2, p = (None, None) if reason else chi_square(observed, [total * split[a] for a in arms])
    return {
        "experiment": experiment,
        "users": total,
        "arms": ", ".join(
            f"{arm} {n} ({n / total:.2%}" + (f" of {split[arm]:.2%})" if split and arm in split else ")")
            for arm, n in zip(arms, observed)
        ),
        "chi_square": float(chi2) if chi2 is not None else None,
        "p_value": p,
        "mismatch": p is not None and p < settings.srm_alpha,
        "test": reason or f"chi-square, mismatch below p={settings.srm_alpha}",
    }


def chi_square(observed: list[int], expected: list[float]) -> tuple[float, float]:
    """Pearson's goodness-of-fit statistic and p-value, as scipy.stats.chisquare gives them, without its
    array checks: the daily check runs it per experiment and scope, the tests over thousands of days."""
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return statistic, float(chdtrc(len(observed) - 1, statistic))


def _untestable(counts: dict[str, int], split: dict[str, float] | None, total: int) -> str:
    if split is None:
        return "not tested: the experiment is not in the experiments file"
    unknown = sorted(set(counts) - set(split))
    if unknown:
        return f"not tested: arms {', '.join(unknown)} are not in the experiments file's split"
    small = [arm for arm, share in split.items() if total * share < 5]
    if small:  # the chi-square approximation needs about 5 expected users per arm
        return f"not tested: fewer than 5 users expected in {', '.join(small)}"
    return ""


# --- latency, time series, drops -------------------------------------------------------------------------
def latency(logs: pl.DataFrame) -> pl.DataFrame:
    """Latency percentiles per role, endpoint, served entry and version, from the logs."""
    return (
        logs.group_by("role", "endpoint", "served_model", "model_version")
        .agg(
            pl.len().alias("answers"),
            *[pl.col("latency_ms").quantile(q, "linear").alias(f"p{int(q * 100)}_ms") for q in (0.5, 0.9, 0.99)],
        )
        .sort("role", "endpoint", "served_model", "model_version")
    )


def latency_breaches(latencies: pl.DataFrame, slo_p99_ms: float, minimum_answers: int) -> pl.DataFrame:
    """The `latency` rows of live answers whose P99 is over the SLO. Shadows are left out (no user waits
    for them), and so are entries with fewer than `minimum_answers` answers: their P99 is their slowest."""
    if latencies.is_empty():
        return latencies
    return latencies.filter(
        (pl.col("role") == LIVE) & (pl.col("answers") >= minimum_answers) & (pl.col("p99_ms") > slo_p99_ms)
    )


def ctr_over_time(answers: pl.DataFrame, every: str = "1h") -> pl.DataFrame:
    """CTR@k per variant (live and shadow) per time bucket."""
    return (
        answers.sort("served_at")
        .group_by_dynamic("served_at", every=every, group_by=["role", "variant"])
        .agg((pl.col("hits").sum() / pl.col("shown").sum()).alias("ctr"), pl.len().alias("answers"))
        .sort("role", "variant", "served_at")
    )


@dataclass(frozen=True)
class Drop:
    served_model: str
    baseline_ctr: float
    ctr: float
    relative_drop: float
    p_value: float


def drops(
    today: pl.DataFrame, history: pl.DataFrame, threshold: float, alpha: float, minimum_users: int = 100
) -> list[Drop]:
    """Live entries whose CTR fell more than `threshold` (relative) below their CTR pooled over earlier days
    (`history`: earlier `by_model` results), beyond noise (one-sided z-test at `alpha`). An entry with fewer
    than `minimum_users` users on either side, or a group without a standard error (a single user), is not
    tested: its interval would be no interval, and a missing error taken as 0 makes any dip significant."""
    found = []
    if today.is_empty() or history.is_empty():
        return found

    def pooled(frame: pl.DataFrame, name: str) -> pl.DataFrame:  # one CTR per entry over its groups
        return (
            frame.filter(pl.col("role") == LIVE)
            .group_by("served_model")
            .agg(
                (pl.col("hits").sum() / pl.col("shown").sum()).alias(name),
                ((pl.col("ctr_se") * pl.col("shown")) ** 2)
                .sum()
                .sqrt()
                .truediv(pl.col("shown").sum())
                .alias(f"{name}_se"),
                pl.col("users").sum().alias(f"{name}_users"),
            )
        )

    for row in pooled(today, "ctr").join(pooled(history, "baseline"), on="served_model").iter_rows(named=True):
        se = math.hypot(row["ctr_se"], row["baseline_se"]) if row["ctr_se"] is not None else math.nan
        small = min(row["ctr_users"], row["baseline_users"]) < minimum_users
        if not row["baseline"] or small or not se > 0:  # NaN se: some group had one user
            continue
        relative = (row["baseline"] - row["ctr"]) / row["baseline"]
        p = float(norm.sf(relative * row["baseline"] / se))
        if relative > threshold and p < alpha:
            found.append(Drop(row["served_model"], row["baseline"], row["ctr"], relative, p))
    return found


# --- promotion evidence ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    passed: bool
    reason: str
    source: str = ""  # the experiment or shadow the verdict comes from
    difference: float = math.nan
    p_value: float = math.nan


def newest_comparisons(lake: Lake, day: date, days: int) -> pl.DataFrame:
    """The online comparisons (A/B and shadow) of the newest day with any, among `days` days up to `day`."""
    for back in range(days):
        path = lake.partition_path(ZONE, COMPARISONS_TABLE, day - timedelta(days=back))
        if path.exists():
            return pl.read_parquet(path)
    return pl.DataFrame()


def online_verdict(comparisons: pl.DataFrame, challenger: str, champion: str, margin: float = 0.0) -> Evidence:
    """Whether an A/B test shows `challenger` beating `champion` on CTR@k: the comparison with the most users
    whose treatment served only the challenger and control only the champion; it passes when the
    difference exceeds `margin` and the group-sequential test is significant after Holm's adjustment over
    the experiment's variants and metrics. Shadows are no evidence (counterfactual)."""
    if comparisons.is_empty():
        return Evidence(False, "no online comparison logged yet")
    if "counterfactual" in comparisons.columns:  # a shadow's agreement is no evidence of a lift
        comparisons = comparisons.filter(~pl.col("counterfactual"))
    if "metric" in comparisons.columns:
        comparisons = comparisons.filter(pl.col("metric") == PRIMARY)
    fitting = comparisons.filter((pl.col("variant_versions") == challenger) & (pl.col("control_versions") == champion))
    if fitting.is_empty():
        return Evidence(False, f"no A/B test compared v{challenger} with v{champion} yet")
    best = fitting.sort(pl.col("variant_users") + pl.col("control_users"), descending=True).row(0, named=True)
    source, p = best["experiment"], best["adjusted_p_value"]
    if best.get("sample_ratio_mismatch"):  # the arms are not the randomized groups: no difference is evidence
        return Evidence(False, f"{source}: sample-ratio mismatch, its comparisons cannot be trusted", source)
    if p is None:
        return Evidence(False, f"{source}: {best['test']}", source, best["difference"])
    if not best["significant"]:
        return Evidence(
            False,
            f"{source}: difference {best['cuped_difference']:+.4f} not significant "
            f"(adjusted p={p:.3g}; {best['users_still_needed']} more users per arm needed)",
            source,
            best["cuped_difference"],
            p,
        )
    passed = best["cuped_difference"] > margin
    return Evidence(
        passed,
        f"{source}: CTR@k {best['variant_value']:.4f} vs {best['control_value']:.4f} "
        f"(CUPED difference {best['cuped_difference']:+.4f}, adjusted p={p:.3g}, margin {margin})",
        source,
        best["cuped_difference"],
        p,
    )
