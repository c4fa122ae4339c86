"""Online accuracy: how served recommendations did on the outcomes that followed them. Plain Python.

A logged answer (engines.prediction_logs) showed the user its top k items at `served_at`; a shown item
is a hit when a click or play of it (warehouse interactions) is credited to the answer. Each outcome is
credited to at most one answer (`credited_outcomes`): the one whose request id the interaction echoes,
else the last that showed the item to the user within `horizon` before it; crediting every answer that
showed the item counted one click two or three times, more often in the arm that repeats its lists.
Per group of answers (model version, served entry, variant, role):
- CTR@k = hits / items shown (a ratio over users: its interval is the delta method over users, the
  unit experiments randomize);
- NDCG@k with binary relevance, the ideal order being the answer's hits first; averaged over answers;
- calibration = observed hits / expected hits, expected being sigmoid(score) (the two-tower model is
  trained with a logistic loss on that score): 1 is calibrated, below 1 over-confident;
each with a normal interval at `confidence`.

Per experiment (intent to treat: every live answer counts for the variant its user was assigned in
that experiment, whichever experiment decided who answered): each variant's CTR against the control's
with a two-sided z-test, and the users per arm a test needs to detect a `minimum_effect` relative lift
at `alpha` and `power`, with the users still missing. Where an arm has fewer than `minimum_users`
users, no p-value, interval or significance is published and `test` says why. Each arm's served-version
mix (`*_version_mix`: answers per model version) shows an arm another experiment's variant answered.

Sample-ratio mismatch (`sample_ratio`): per experiment, the users assigned to each arm against the
configured split, a chi-square goodness-of-fit test; p < `srm_alpha` means the assignment or the
logging is broken and no comparison of that experiment can be trusted.

Shadows are scored counterfactually, on the outcomes credited to the live answer of their request: an
item the live model did not show never counts, so the estimate always favours the live model and no
significance test of it means anything. Shadow against live (requests where the live version differs
from the shadow's) publishes agreement instead: overlap@k, rank correlation and score shift."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import date, timedelta

import numpy as np
import polars as pl
from scipy.stats import chisquare, kendalltau, norm

from engines.lake import Lake
from engines.prediction_logs import LIVE, OK, SHADOW

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
    """One row per recommend answer that succeeded: its hits, items shown, NDCG and expected hits at k. A
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
        (1 / (1 + (-pl.col("score")).exp())).sum().alias("expected"),
    )
    answers = answers.join(per_answer, on="answer", how="left").with_columns(
        pl.col("hits").fill_null(0),
        pl.col("shown").fill_null(0),
        pl.col("dcg").fill_null(0.0),
        pl.col("expected").fill_null(0.0),
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
    `logs` that showed its item to its user within `horizon` before it (a shadow's list was never seen):
    the answer whose request id the interaction echoes (in its `session_id`, where the data has one),
    else the last of them (ties: the greater request id). One row per credited outcome: `outcome` (its
    row number in `interactions`), request_id, user_id, item_id, at."""
    shown = _shown(_recommended(logs).filter(pl.col("role") == LIVE).with_row_index("answer"))
    echoed = pl.col(ECHO) if ECHO in interactions.columns else pl.lit(None, pl.String)
    events = (
        interactions.with_row_index("outcome")
        .filter(pl.col("event_type").is_in(list(settings.outcomes)))
        .select("outcome", "user_id", "item_id", pl.col("event_timestamp").alias("at"), echoed.alias("echoed"))
    )
    candidates = (
        events.join(shown.select("request_id", "user_id", "item_id", "served_at"), on=["user_id", "item_id"])
        .filter((pl.col("at") >= pl.col("served_at")) & (pl.col("at") <= pl.col("served_at") + settings.horizon))
        .with_columns((pl.col("request_id") == pl.col("echoed")).fill_null(False).alias("is_echoed"))
    )
    return (
        candidates.sort(["is_echoed", "served_at", "request_id"], descending=True)
        .group_by("outcome", maintain_order=True)
        .first()
        .select("outcome", "request_id", "user_id", "item_id", "at")
        .sort("outcome")
    )


def _per_user(answers: pl.DataFrame) -> pl.DataFrame:
    return answers.group_by("user_id").agg(
        pl.col("hits").sum(),
        pl.col("shown").sum(),
        pl.col("ndcg").sum(),
        pl.len().alias("answers"),
        pl.col("expected").sum(),
    )


def _metrics(users: pl.DataFrame, settings: AccuracySettings) -> dict:
    h, n = users["hits"].to_numpy().astype(float), users["shown"].to_numpy().astype(float)
    ctr = Ratio.of(h, n)
    ndcg = Ratio.of(users["ndcg"].to_numpy(), users["answers"].to_numpy().astype(float))
    calibration = Ratio.of(h, users["expected"].to_numpy())
    row = {"users": users.height, "answers": int(users["answers"].sum()), "shown": int(n.sum()), "hits": int(h.sum())}
    for name, ratio in (("ctr", ctr), ("ndcg", ndcg), ("calibration", calibration)):
        low, high = ratio.interval(settings.z)
        row.update({name: ratio.value, f"{name}_low": low, f"{name}_high": high, f"{name}_se": ratio.se})
    return row


GROUP = ["role", "served_model", "registry_model", "model_version", "variant"]


def by_model(answers: pl.DataFrame, settings: AccuracySettings) -> pl.DataFrame:
    """CTR@k, NDCG@k and calibration with intervals per (role, entry, model version, variant)."""
    rows = []
    for key, group in answers.group_by(GROUP, maintain_order=True):
        metrics = _metrics(_per_user(group), settings)
        rows.append({**dict(zip(GROUP, key)), "counterfactual": key[0] == SHADOW, **metrics})
    return pl.DataFrame(rows).sort(GROUP) if rows else pl.DataFrame()


# --- experiments -----------------------------------------------------------------------------------------
def by_experiment(answers: pl.DataFrame, controls: dict[str, str], settings: AccuracySettings) -> pl.DataFrame:
    """Each experiment's variants against its control on CTR@k (live answers, intent to treat)."""
    live = answers.filter(pl.col("role") == LIVE)
    assignments = [json.loads(a) for a in live["assignments"].to_list()]  # experiment -> variant, per answer
    names = sorted({e for a in assignments for e in a})
    rows = []
    for experiment in names:
        variant_of = pl.Series("arm", [a.get(experiment) for a in assignments], dtype=pl.String)
        arm = live.with_columns(variant_of).drop_nulls("arm")
        arms = {v: arm.filter(pl.col("arm") == v) for v in sorted(set(arm["arm"].to_list()))}
        control = controls.get(experiment) or ("control" if "control" in arms else min(arms))
        if control not in arms:
            continue
        for variant, group in arms.items():
            if variant != control:
                rows.append(compare(experiment, control, arms[control], variant, group, settings))
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def compare(
    experiment: str,
    control: str,
    control_answers: pl.DataFrame,
    variant: str,
    answers: pl.DataFrame,
    settings: AccuracySettings,
) -> dict:
    c, t = _per_user(control_answers), _per_user(answers)
    rc = Ratio.of(c["hits"].to_numpy().astype(float), c["shown"].to_numpy().astype(float))
    rt = Ratio.of(t["hits"].to_numpy().astype(float), t["shown"].to_numpy().astype(float))
    se = math.hypot(rc.se, rt.se)
    return _comparison(
        experiment,
        control,
        variant,
        rc,
        rt,
        rt.value - rc.value,
        se,
        (rc.se**2 * rc.units, rt.se**2 * rt.units),
        control_answers,
        answers,
        settings,
    )


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
                "control_ctr": rl.value,
                "variant_ctr": rs.value,
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


def _comparison(
    experiment: str,
    control: str,
    variant: str,
    rc: Ratio,
    rt: Ratio,
    diff: float,
    se: float,
    variances: tuple[float, float],
    control_answers: pl.DataFrame,
    answers: pl.DataFrame,
    settings: AccuracySettings,
) -> dict:
    too_few = _too_few(control, rc.units, variant, rt.units, settings.minimum_users)
    z = diff / se if se and not math.isnan(se) and not too_few else math.nan
    p = float(2 * norm.sf(abs(z))) if not math.isnan(z) else None
    effect = settings.minimum_effect * rc.value
    z_sum = float(norm.ppf(1 - settings.alpha / 2) + norm.ppf(settings.power))
    needed = math.ceil(z_sum**2 * sum(variances) / effect**2) if effect and not math.isnan(sum(variances)) else None
    return {
        "experiment": experiment,
        "control": control,
        "variant": variant,
        "control_versions": ",".join(sorted(set(control_answers["model_version"].to_list()))),
        "variant_versions": ",".join(sorted(set(answers["model_version"].to_list()))),
        "control_version_mix": version_mix(control_answers),
        "variant_version_mix": version_mix(answers),
        "control_users": rc.units,
        "variant_users": rt.units,
        "control_ctr": rc.value,
        "variant_ctr": rt.value,
        "difference": diff,
        "difference_low": diff - settings.z * se if p is not None else None,
        "difference_high": diff + settings.z * se if p is not None else None,
        "p_value": p,
        "significant": p is not None and p < settings.alpha,
        "test": too_few or ("z-test" if p is not None else "not tested: no variance between users"),
        "users_needed_per_arm": needed,
        "users_still_needed": max(0, needed - min(rc.units, rt.units)) if needed is not None else None,
        "counterfactual": False,
    }


def _too_few(control: str, control_users: int, variant: str, variant_users: int, minimum: int) -> str:
    """Why no test is run ("" when one is): an arm under `minimum` users."""
    arms = ((control, control_users), (variant, variant_users))
    small = [f"{arm} has {users} users" for arm, users in arms if users < minimum]
    return f"not tested: {' and '.join(small)}, fewer than {minimum}" if small else ""


def version_mix(answers: pl.DataFrame) -> str:
    """Which model versions answered an arm: "v2 900 (90.0%), v3 100 (10.0%)", most answers first."""
    counts = answers.group_by("model_version").len().sort(["len", "model_version"], descending=[True, False])
    total = answers.height
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
        srm_test(experiment, {v: len(u) for v, u in arms.items()}, splits.get(experiment), settings)
        for experiment, arms in sorted(users.items())
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
    chi2, p = (None, None) if reason else chisquare(observed, [total * split[a] for a in arms])
    p = float(p) if p is not None else None
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


def drops(today: pl.DataFrame, history: pl.DataFrame, threshold: float, alpha: float) -> list[Drop]:
    """Live entries whose CTR fell more than `threshold` (relative) below their CTR pooled over earlier days
    (`history`: earlier `by_model` results), beyond noise (one-sided z-test at `alpha`)."""
    found = []
    if today.is_empty() or history.is_empty():
        return found

    def pooled(frame: pl.DataFrame, name: str) -> pl.DataFrame:  # one CTR per entry over its groups
        return (
            frame.filter(pl.col("role") == LIVE)
            .group_by("served_model")
            .agg(
                (pl.col("hits").sum() / pl.col("shown").sum()).alias(name),
                ((pl.col("ctr_se").fill_nan(0.0) * pl.col("shown")) ** 2)
                .sum()
                .sqrt()
                .truediv(pl.col("shown").sum())
                .alias(f"{name}_se"),
            )
        )

    for row in pooled(today, "ctr").join(pooled(history, "baseline"), on="served_model").iter_rows(named=True):
        if not row["baseline"]:
            continue
        relative = (row["baseline"] - row["ctr"]) / row["baseline"]
        se = math.hypot(row["ctr_se"] or 0.0, row["baseline_se"] or 0.0)
        p = float(norm.sf(relative * row["baseline"] / se)) if se else 0.0
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
    difference exceeds `margin` and is significant. Shadows are no evidence (counterfactual)."""
    if comparisons.is_empty():
        return Evidence(False, "no online comparison logged yet")
    if "counterfactual" in comparisons.columns:  # a shadow's agreement is no evidence of a lift
        comparisons = comparisons.filter(~pl.col("counterfactual"))
    fitting = comparisons.filter((pl.col("variant_versions") == challenger) & (pl.col("control_versions") == champion))
    if fitting.is_empty():
        return Evidence(False, f"no A/B test compared v{challenger} with v{champion} yet")
    best = fitting.sort(pl.col("variant_users") + pl.col("control_users"), descending=True).row(0, named=True)
    source = best["experiment"]
    if best["p_value"] is None:
        return Evidence(False, f"{source}: {best['test']}", source, best["difference"])
    if not best["significant"]:
        return Evidence(
            False,
            f"{source}: difference {best['difference']:+.4f} not significant "
            f"(p={best['p_value']:.3g}; {best['users_still_needed']} more users per arm needed)",
            source,
            best["difference"],
            best["p_value"],
        )
    passed = best["difference"] > margin
    return Evidence(
        passed,
        f"{source}: CTR@k {best['variant_ctr']:.4f} vs {best['control_ctr']:.4f} "
        f"(difference {best['difference']:+.4f}, p={best['p_value']:.3g}, margin {margin})",
        source,
        best["difference"],
        best["p_value"],
    )
