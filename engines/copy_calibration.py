"""The copy detector's threshold and its honest accuracy: chosen on a ground-truth release's labels,
estimated on rows that did not choose it.

The threshold is the best-F1 cut on all labelled items, moved halfway down to the next lower score
(a cut exactly at the weakest labelled copy would miss the next copy a hair weaker). Its accuracy
comes from stratified k-fold cross-validation of that same rule: each fold's items are flagged at the
threshold chosen on the other folds. Pooled held-out flags give recall (flagged copies / copies) and
the false-positive rate (flagged non-copies / non-copies), each with a 95% Wilson interval. The
release's queues over-sample likely copies, so precision on its rows would overstate the catalogue's;
precision is instead computed for the catalogue's prevalence, estimated on the random audit items:
precision = recall x p / (recall x p + fpr x (1 - p)), its interval from the ends of the three intervals
(conservative).

The calibration is a small JSON file in the lake, written by the flags asset and read by the online
scorer, so batch and online flag at the same threshold.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from engines.violation_accuracy import Rate

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
    threshold: float
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
        if not path.exists():
            return None
        saved = json.loads(path.read_text())
        estimates = {k: Estimate(**v) for k, v in saved.items() if isinstance(v, dict)}
        return cls(**{**saved, **estimates})


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


def held_out_flags(similarity: np.ndarray, positive: np.ndarray, folds: int, seed: int = 0) -> np.ndarray:
    """Each row flagged (or not) at the threshold chosen on the other folds."""
    fold = stratified_folds(positive, folds, seed)
    flagged = np.zeros(len(similarity), dtype=bool)
    for k in range(folds):
        threshold = best_threshold(similarity[fold != k], positive[fold != k])
        if threshold is not None:
            flagged[fold == k] = similarity[fold == k] >= threshold
    return flagged


def precision_at(recall: float, fpr: float, prevalence: float) -> float | None:
    """Precision over a catalogue with `prevalence` copies."""
    flagged = recall * prevalence + fpr * (1 - prevalence)
    return recall * prevalence / flagged if flagged else None


def bootstrap_rates(similarity: np.ndarray, positive: np.ndarray, audit: np.ndarray, draws: int, seed: int = 0):
    """(recall, false-positive rate, precision) of `draws` bootstrap runs of the whole rule: the threshold
    chosen on a resample, scored on the rows left out of it (prevalence from the resample's audit rows)."""
    rng = np.random.default_rng(seed)
    rates = []
    for _ in range(draws):
        sample = rng.integers(0, len(positive), len(positive))
        out = np.ones(len(positive), dtype=bool)
        out[sample] = False
        threshold = best_threshold(similarity[sample], positive[sample])
        copies, others = positive & out, ~positive & out
        if threshold is None or not copies.any() or not others.any() or not audit[sample].any():
            continue
        flagged = similarity >= threshold
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


def calibrate(
    similarity: np.ndarray, positive: np.ndarray, audit: np.ndarray, release: str, folds: int = FOLDS
) -> Calibration | None:
    """The threshold on all rows and its cross-validated accuracy (`audit`: the row came through the
    random audit queue). None without both classes; fewer folds when a class has fewer rows."""
    similarity = np.where(np.isfinite(similarity), similarity, -np.inf)
    threshold = best_threshold(similarity, positive)
    if threshold is None:
        return None
    folds = max(2, min(folds, int(positive.sum()), int((~positive).sum())))
    flagged = held_out_flags(similarity, positive, folds)
    recall = (flagged & positive).sum() / positive.sum()
    fpr = (flagged & ~positive).sum() / (~positive).sum()
    prevalence = Rate(int(positive[audit].sum()), int(audit.sum()))
    low, high = prevalence.interval
    precision = precision_at(recall, fpr, prevalence.value) if prevalence.trials else None
    rates = bootstrap_rates(similarity, positive, audit, BOOTSTRAPS)
    return Calibration(
        threshold=threshold,
        release=release,
        labelled_items=len(positive),
        folds=folds,
        recall=interval(rates[:, 0], float(recall)),
        false_positive_rate=interval(rates[:, 1], float(fpr)),
        prevalence=Estimate(prevalence.value, low, high),
        precision=interval(rates[:, 2], precision),
    )
