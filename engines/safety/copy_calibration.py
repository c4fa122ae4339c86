"""The copy scorer's model, threshold and honest accuracy: fitted on a ground-truth release's labels,
estimated on rows that fitted neither.

The scorer is a logistic regression over the features of each item's best match (`copy_model`). Its
threshold is the best-F1 cut on out-of-fold scores (each labelled item scored by a model fitted without
its fold), moved halfway down to the next lower score (a cut exactly at the weakest labelled copy would
miss the next copy a hair weaker); the model used from then on is fitted on every labelled item. Its
accuracy comes from nested stratified k-fold cross-validation of that whole rule: each outer fold's items
are flagged by the model and threshold chosen on the other folds alone. Pooled held-out flags give recall
(flagged copies / copies) and the false-positive rate (flagged non-copies / non-copies). The release's
queues over-sample likely copies, so precision on its rows would overstate the catalogue's; precision is
instead computed for the catalogue's prevalence, estimated on the random audit items:
precision = recall x p / (recall x p + fpr x (1 - p)). Intervals: a bootstrap of the whole rule (fitted
on a resample, scored on the rows left out of it), widened to contain the point estimate and the Wilson
intervals of the held-out counts (for precision: its value at the ends of the recall, false-positive
rate and prevalence intervals), since a bootstrap collapses to a point when the classes separate.

The calibration (model, threshold, estimates) is a small JSON file in the lake, written by the flags
asset and read by the online scorer, so batch and online score with the same model and threshold.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.safety.copy_model import CopyModel, fit_many
from engines.safety.violation_accuracy import Rate

FOLDS = 5
BOOTSTRAPS = 200
CALIBRATION_FILE = Path("content_violations") / "calibration.json"


@dataclass(frozen=True)
class Estimate:
    value: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Calibration:
    model: CopyModel
    threshold: float  # on the model's score
    release: str
    labelled_items: int
    folds: int
    recall: Estimate
    false_positive_rate: Estimate
    prevalence: Estimate  # on the audit sample
    precision: Estimate  # at the catalogue's prevalence

    def save(self, lake_root: Path) -> Path:
        path = lake_root / CALIBRATION_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, lake_root: Path) -> Calibration | None:
        path = lake_root / CALIBRATION_FILE
        return cls.read(path) if path.exists() else None

    @classmethod
    def read(cls, path: Path) -> Calibration:
        saved = json.loads(path.read_text())
        estimates = {k: Estimate(**v) for k, v in saved.items() if isinstance(v, dict) and k != "model"}
        return cls(**{**saved, **estimates, "model": CopyModel.from_json(saved["model"])})


def best_threshold(similarity: np.ndarray, positive: np.ndarray) -> float | None:
    """The cut with the best F1 (the highest on ties), halfway down to the next lower score; None
    without both classes. A missing similarity (-inf: no earlier item to match) is never flagged."""
    if positive.all() or not positive.any():
        return None
    order = np.argsort(-similarity, kind="stable")
    ranked, hits = similarity[order], np.cumsum(positive[order])
    last_of_value = np.flatnonzero(np.append(ranked[1:] != ranked[:-1], True) & np.isfinite(ranked))
    f1 = 2 * hits[last_of_value] / (last_of_value + 1 + positive.sum())
    best = int(np.argmax(f1))
    cut = ranked[last_of_value[best]]
    below = ranked[last_of_value[best] + 1] if last_of_value[best] + 1 < len(ranked) else cut
    return float((cut + below) / 2) if np.isfinite(below) else float(cut)


def stratified_folds(positive: np.ndarray, folds: int, seed: int = 0) -> np.ndarray:
    """A fold number per row, each class dealt round-robin over the folds in a seeded random order."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(positive), dtype=np.int64)
    for cls in (True, False):
        rows = rng.permutation(np.flatnonzero(positive == cls))
        fold[rows] = np.arange(len(rows)) % folds
    return fold


@dataclass(frozen=True)
class Rule:
    model: CopyModel
    threshold: float

    def flags(self, features: np.ndarray, matched: np.ndarray) -> np.ndarray:
        return matched & (self.model.score(features) >= self.threshold)


def fitted_rule(features: np.ndarray, matched: np.ndarray, positive: np.ndarray, folds: int = FOLDS) -> Rule | None:
    """The model fitted on every row, the threshold chosen on the rows' out-of-fold scores (each row
    scored by a model fitted on the other folds); None without both classes (fewer folds when a class has
    fewer rows)."""
    return fitted_rules(features, matched, positive, [np.arange(len(positive))], folds)[0]


def fitted_rules(
    features: np.ndarray, matched: np.ndarray, positive: np.ndarray, samples: list[np.ndarray], folds: int = FOLDS
) -> list[Rule | None]:
    """`fitted_rule` on each sample's rows (`samples`: row numbers, repeats allowed), every model of every
    sample fitted in one batch (`fit_many`: a row drawn twice counts twice)."""
    plans, counts = [], []  # per sample: (its folds, its rows' fold, its first model) or None
    for sample in samples:
        k = min(folds, int(positive[sample].sum()), int((~positive[sample]).sum()))
        if k < 2:
            plans.append(None)
            continue
        fold = stratified_folds(positive[sample], k)
        plans.append((k, fold, len(counts)))
        counts += [np.bincount(sample[fold != j], minlength=len(positive)) for j in range(k)]
        counts.append(np.bincount(sample, minlength=len(positive)))
    models = fit_many(features, positive, np.array(counts)) if counts else []
    rules: list[Rule | None] = []
    for sample, plan in zip(samples, plans, strict=True):
        if plan is None:
            rules.append(None)
            continue
        k, fold, first = plan
        scores = np.full(len(sample), -np.inf)  # -inf: unmatched, or a fold whose complement lacks a class
        for j in range(k):
            train, test = fold != j, (fold == j) & matched[sample]
            if positive[sample][train].any() and not positive[sample][train].all():
                scores[test] = models[first + j].score(features[sample][test])
        threshold = best_threshold(scores, positive[sample])
        rules.append(None if threshold is None else Rule(models[first + k], threshold))
    return rules


def held_out_flags(
    features: np.ndarray, matched: np.ndarray, positive: np.ndarray, folds: int, fold: np.ndarray | None = None
) -> np.ndarray:
    """Each row flagged (or not) by the rule (model and threshold) fitted on the other folds alone
    (`fold`: each row's fold; default stratified)."""
    fold = stratified_folds(positive, folds) if fold is None else fold
    flagged = np.zeros(len(positive), dtype=bool)
    rules = fitted_rules(features, matched, positive, [np.flatnonzero(fold != k) for k in range(folds)])
    for k, rule in enumerate(rules):
        if rule is not None:
            flagged[fold == k] = rule.flags(features[fold == k], matched[fold == k])
    return flagged


def precision_at(recall: float, fpr: float, prevalence: float) -> float | None:
    """Precision over a catalogue with `prevalence` copies."""
    flagged = recall * prevalence + fpr * (1 - prevalence)
    return recall * prevalence / flagged if flagged else None


def bootstrap_rates(features, matched, positive, audit, draws: int, seed: int = 0) -> np.ndarray:
    """(recall, false-positive rate, precision) of `draws` bootstrap runs of the whole rule: fitted on a
    resample, scored on the rows left out of it (prevalence from the resample's audit rows)."""
    rng = np.random.default_rng(seed)
    samples = [rng.integers(0, len(positive), len(positive)) for _ in range(draws)]
    outs = [np.bincount(sample, minlength=len(positive)) == 0 for sample in samples]
    usable = [
        (sample, out)
        for sample, out in zip(samples, outs, strict=True)
        if (positive & out).any() and (~positive & out).any() and audit[sample].any()
    ]
    rules = fitted_rules(features, matched, positive, [sample for sample, _ in usable])
    rates = []
    for (sample, out), rule in zip(usable, rules, strict=True):
        if rule is None:
            continue
        copies, others = positive & out, ~positive & out
        flagged = rule.flags(features, matched)
        recall, fpr = (flagged & copies).sum() / copies.sum(), (flagged & others).sum() / others.sum()
        prevalence = positive[sample][audit[sample]].mean()
        rates.append((recall, fpr, precision_at(recall, fpr, prevalence)))
    return np.array(rates, dtype=float).reshape(-1, 3)


def interval(values: np.ndarray, point: float | None) -> Estimate:
    values = values[np.isfinite(values)]
    if point is None or not len(values):
        return Estimate(point, None, None)
    low, high = np.percentile(values, [2.5, 97.5])
    return Estimate(float(point), float(min(low, point)), float(max(high, point)))


def widened(estimate: Estimate, bounds: tuple[float | None, float | None]) -> Estimate:
    """`estimate`'s interval stretched to contain `bounds` (a bootstrap of separable classes collapses to
    a point; the Wilson interval of the counts does not)."""
    low, high = bounds
    if estimate.value is None or low is None or high is None:
        return estimate
    return Estimate(
        estimate.value,
        low if estimate.low is None else min(estimate.low, low),
        high if estimate.high is None else max(estimate.high, high),
    )


def precision_from(recall: Rate, fpr: Rate, prevalence: Rate) -> Estimate:
    """Precision at the audit prevalence, its interval from the ends of the three Wilson intervals
    (conservative)."""
    if not prevalence.trials:
        return Estimate(None, None, None)
    (r_low, r_high), (f_low, f_high), (p_low, p_high) = recall.interval, fpr.interval, prevalence.interval
    return Estimate(
        precision_at(recall.value, fpr.value, prevalence.value),
        precision_at(r_low, f_high, p_low) or 0.0,
        precision_at(r_high, f_low, p_high) if precision_at(r_high, f_low, p_high) is not None else 1.0,
    )


def calibrate(
    features: np.ndarray,
    matched: np.ndarray,
    positive: np.ndarray,
    audit: np.ndarray,
    release: str,
    folds: int = FOLDS,
    draws: int = BOOTSTRAPS,
) -> Calibration | None:
    """The rule on all rows and its cross-validated accuracy (`features`, `matched` as
    `copy_model.copy_features` gives them; `audit`: the row came through the random audit queue). None
    without both classes."""
    rule = fitted_rule(features, matched, positive, folds)
    if rule is None:
        return None
    folds = min(folds, int(positive.sum()), int((~positive).sum()))
    flagged = held_out_flags(features, matched, positive, folds)
    recall = Rate(int((flagged & positive).sum()), int(positive.sum()))
    fpr = Rate(int((flagged & ~positive).sum()), int((~positive).sum()))
    prevalence = Rate(int(positive[audit].sum()), int(audit.sum()))
    rates = bootstrap_rates(features, matched, positive, audit, draws)
    precision = precision_from(recall, fpr, prevalence)
    return Calibration(
        model=rule.model,
        threshold=rule.threshold,
        release=release,
        labelled_items=len(positive),
        folds=folds,
        recall=widened(interval(rates[:, 0], recall.value), recall.interval),
        false_positive_rate=widened(interval(rates[:, 1], fpr.value), fpr.interval),
        prevalence=Estimate(prevalence.value, *prevalence.interval),
        precision=widened(interval(rates[:, 2], precision.value), (precision.low, precision.high)),
    )
