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

from engines.safety.content_violation import AUDIT

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


PLOTTED = ("precision", "recall")
COLOURS = {"precision": "#1f77b4", "recall": "#d62728"}


def audit_history(days: list, slices: list[pl.DataFrame]) -> pl.DataFrame:
    """One row per day (sorted): the audit slice's items and each plotted rate with its interval, nulls on a
    day without audit items."""
    rows = []
    for day, frame in zip(days, slices):
        audit = frame.filter(pl.col("slice") == AUDIT)
        row = audit.row(0, named=True) if audit.height else {}
        rows.append(
            {
                "day": day,
                "items": int(row.get("items") or 0),
                **{f"{m}{s}": row.get(f"{m}{s}") for m in PLOTTED for s in ("", "_low", "_high")},
            }
        )
    schema = {
        "day": pl.Date,
        "items": pl.Int64,
        **{f"{m}{s}": pl.Float64 for m in PLOTTED for s in ("", "_low", "_high")},
    }
    return pl.DataFrame(rows, schema=schema).sort("day")


def history_svg(history: pl.DataFrame, width: int = 640, height: int = 200) -> str:
    """Audit precision and recall per day with their 95% intervals as an SVG chart (0 to 1). A day
    without audit items (or without a flagged item or a violation among them) has no point and is
    marked on the axis, so the chart renders whatever the days hold."""
    left, top = 40, 30
    n = history.height
    step = (width - left - 20) / max(n, 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + top + 40}">',
        f'<text x="10" y="16" font-size="13">audit precision and recall per day, 95% intervals ({n} days)</text>',
        f'<line x1="{left}" y1="{top + height}" x2="{width - 10}" y2="{top + height}" stroke="#999"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" stroke="#999"/>',
        f'<text x="5" y="{top + 4}" font-size="10">1.0</text><text x="5" y="{top + height}" font-size="10">0.0</text>',
    ]
    if not n:
        parts.append(f'<text x="{left + 10}" y="{top + height / 2}" font-size="12">no days measured yet</text>')
    for i, row in enumerate(history.iter_rows(named=True)):
        x = left + step * (i + 0.5)
        parts.append(f'<text x="{x - 14:.1f}" y="{top + height + 14}" font-size="9">{row["day"]:%m-%d}</text>')
        if not row["items"]:
            parts.append(
                f'<text x="{x - 3:.1f}" y="{top + height - 4}" font-size="10" fill="#999">'
                "&#8709;<title>no audit items</title></text>"
            )
        for j, metric in enumerate(PLOTTED):
            value = row[metric]
            if value is None:
                continue
            cx = x + (j - 0.5) * 6
            y = [top + height * (1 - row[f"{metric}{s}"]) for s in ("", "_low", "_high")]
            colour = COLOURS[metric]
            parts.append(f'<line x1="{cx:.1f}" y1="{y[1]:.1f}" x2="{cx:.1f}" y2="{y[2]:.1f}" stroke="{colour}"/>')
            parts.append(f'<circle cx="{cx:.1f}" cy="{y[0]:.1f}" r="3" fill="{colour}"/>')
    for j, metric in enumerate(PLOTTED):
        parts.append(
            f'<text x="{width - 90}" y="{top + 12 * j}" font-size="11" fill="{COLOURS[metric]}">{metric}</text>'
        )
    parts.append(
        f'<text x="{left}" y="{top + height + 32}" font-size="10" fill="#999">&#8709;: no audit items that day</text>'
    )
    parts.append("</svg>")
    return "".join(parts)
