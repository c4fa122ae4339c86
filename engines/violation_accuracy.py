"""The violation detector against human ground truth: a day's flags (what the detector said about the
day's items) against the newest ground-truth release's verdicts on the same items.

Two slices: the release's random audit sample, whose items were drawn without looking at any score (an
unbiased estimate of precision, recall and accuracy), and every labelled item (the other queues pick
likely violations, so this slice overstates prevalence). Each figure has a 95% Wilson interval: the
slices are small, and a rate near 0 or 1 is common here."""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from engines.content_violation import AUDIT

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Rate:
    """successes / trials with its 95% Wilson interval (None without trials)."""

    successes: int
    trials: int

    @property
    def value(self) -> float | None:
        return self.successes / self.trials if self.trials else None

    @property
    def interval(self) -> tuple[float | None, float | None]:
        if not self.trials:
            return None, None
        n, p = self.trials, self.successes / self.trials
        centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
        half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
        return max(0.0, centre - half), min(1.0, centre + half)


def accuracy_slices(flags: pl.DataFrame, verdicts: pl.DataFrame) -> pl.DataFrame:
    """One row per slice ('audit', 'all labelled') of the flagged items with a verdict (`verdicts` as
    `content_violation.release_truth` has them: item_id, is_violation, audit): labelled items, violations,
    flagged, true positives, and precision, recall and accuracy with their intervals."""
    joined = flags.select("item_id", "flagged").join(verdicts, on="item_id", how="inner")
    rows = []
    for name, part in ((AUDIT, joined.filter("audit")), ("all labelled", joined)):
        flagged, violation = part["flagged"], part["is_violation"]
        tp = int((flagged & violation).sum())
        rates = {
            "precision": Rate(tp, int(flagged.sum())),
            "recall": Rate(tp, int(violation.sum())),
            "accuracy": Rate(int((flagged == violation).sum()), part.height),
        }
        row = {
            "slice": name,
            "items": part.height,
            "violations": int(violation.sum()),
            "flagged": int(flagged.sum()),
            "true_positives": tp,
        }
        for metric, rate in rates.items():
            low, high = rate.interval
            row |= {metric: rate.value, f"{metric}_low": low, f"{metric}_high": high}
        rows.append(row)
    return pl.DataFrame(rows, schema=SCHEMA)


SCHEMA = {
    "slice": pl.String,
    "items": pl.Int64,
    "violations": pl.Int64,
    "flagged": pl.Int64,
    "true_positives": pl.Int64,
    **{f"{m}{s}": pl.Float64 for m in ("precision", "recall", "accuracy") for s in ("", "_low", "_high")},
}
