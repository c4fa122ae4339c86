"""Inter-annotator agreement for nominal labels: Krippendorff's alpha (any number of annotators per
item, missing answers allowed), Fleiss' kappa (the same number per item) and Cohen's kappa (two
sequences of labels over the same items). None where a statistic is undefined (e.g. one category).
Alpha's 95% interval by a percentile bootstrap over items, and the Wilson interval of a proportion (an
annotator's accuracy on gold questions)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from itertools import permutations
from math import sqrt

import numpy as np


def krippendorff_alpha(units: Sequence[Sequence[Hashable]]) -> float | None:
    """Nominal alpha; each unit is the list of values it received (missing answers left out).
    Units with fewer than two values are not pairable and drop out, as in Krippendorff (2011)."""
    coincidences: defaultdict[tuple[Hashable, Hashable], float] = defaultdict(float)
    for values in units:
        m = len(values)
        if m < 2:
            continue
        for a, b in permutations(range(m), 2):
            coincidences[(values[a], values[b])] += 1 / (m - 1)
    totals: defaultdict[Hashable, float] = defaultdict(float)
    for (c, _), weight in coincidences.items():
        totals[c] += weight
    n = sum(totals.values())
    observed = sum(w for (c, k), w in coincidences.items() if c != k)
    expected = sum(totals[c] * totals[k] for c in totals for k in totals if c != k)
    if n <= 1 or expected == 0:
        return None
    return 1 - (n - 1) * observed / expected


def krippendorff_alpha_interval(
    units: Sequence[Sequence[Hashable]], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap of nominal alpha: the items (units) are drawn with replacement, as the items
    of a task are a sample of the items it could have held; each draw's alpha comes from the sum of the
    drawn units' coincidence matrices. None when alpha is undefined on the data."""
    pairable = [u for u in units if len(u) >= 2]
    if krippendorff_alpha(pairable) is None:
        return None
    index = {v: i for i, v in enumerate(sorted({v for u in pairable for v in u}, key=str))}
    per_unit = np.zeros((len(pairable), len(index), len(index)))
    for n, values in enumerate(pairable):
        counts = np.bincount([index[v] for v in values], minlength=len(index)).astype(float)
        per_unit[n] = (np.outer(counts, counts) - np.diag(counts)) / (len(values) - 1)
    rng, share = np.random.default_rng(seed), [1 / len(pairable)] * len(pairable)
    alphas = np.concatenate(  # in chunks of draws: a draw holds a count per unit
        [
            _alphas(np.einsum("bn,nkl->bkl", rng.multinomial(len(pairable), share, size), per_unit))
            for size in _chunks(resamples)
        ]
    )
    alphas = alphas[np.isfinite(alphas)]  # a draw of one category only has no alpha
    tail = (1 - level) / 2
    return float(np.quantile(alphas, tail)), float(np.quantile(alphas, 1 - tail))


def _chunks(total: int, size: int = 200) -> list[int]:
    return [min(size, total - start) for start in range(0, total, size)]


def _alphas(coincidences: np.ndarray) -> np.ndarray:
    """Nominal alpha of each coincidence matrix in a stack; NaN where undefined."""
    totals = coincidences.sum(axis=2)
    n = totals.sum(axis=1)
    observed = n - np.trace(coincidences, axis1=1, axis2=2)
    expected = n * n - (totals * totals).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1 - (n - 1) * observed / expected


def fleiss_kappa(units: Sequence[Sequence[Hashable]]) -> float | None:
    """Each unit holds the labels of exactly n raters (the raters may differ between units)."""
    if not units:
        return None
    n = len(units[0])
    if n < 2 or any(len(u) != n for u in units):
        raise ValueError("Fleiss' kappa needs the same number (>= 2) of labels per unit")
    counts = [Counter(u) for u in units]
    share: Counter = Counter()
    for count in counts:
        share.update(count)
    total = len(units) * n
    chance = sum((v / total) ** 2 for v in share.values())
    observed = sum((sum(v * v for v in c.values()) - n) / (n * (n - 1)) for c in counts) / len(units)
    return None if chance == 1 else (observed - chance) / (1 - chance)


def cohen_kappa(first: Sequence[Hashable], second: Sequence[Hashable]) -> float | None:
    if len(first) != len(second):
        raise ValueError("Cohen's kappa needs two label sequences over the same items")
    if not first:
        return None
    n = len(first)
    observed = sum(a == b for a, b in zip(first, second, strict=True)) / n
    left, right = Counter(first), Counter(second)
    chance = sum(left[c] * right[c] for c in left) / (n * n)
    return None if chance == 1 else (observed - chance) / (1 - chance)


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval (95% by default) of successes / trials: unlike the normal
    approximation it stays inside [0, 1] and keeps its coverage near 0 and 1, where good annotators are."""
    if trials == 0:
        return None
    share = successes / trials
    centre = (share + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    # the interval always holds the observed share; rounding must not push 1.0 (or 0.0) outside it
    return max(0.0, min(share, centre - half)), min(1.0, max(share, centre + half))
