"""An annotator model: Dawid and Skene (1979), "Maximum likelihood estimation of observer error-rates
using the EM algorithm". Each annotator has a confusion matrix (row: the true label, column: the label
they answer); the items' true labels are latent. EM alternates the items' label posteriors (E) and
the class prior and confusion matrices that maximise the likelihood (M).

Two changes to the 1979 estimator, both for small counts:
- Dirichlet pseudo-counts on every confusion row (CORRECT on the diagonal, WRONG elsewhere) and on the
  class prior: maximum a posteriori instead of maximum likelihood, so an annotator seen on a handful of
  items never gets a confusion of exactly 0 or 1 (which would make one answer of theirs certain).
- Items with a known label (a gold question's key, a reviewer's verdict) keep it as their posterior:
  they teach the confusion matrices without being re-estimated.

An annotator's answers may carry a weight below 1 (one flagged by gold questions): the E step raises
their likelihood to that power, so their answers move the posteriors less."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

METHOD = "dawid-skene"
CORRECT, WRONG = 4.0, 1.0  # prior pseudo-answers per confusion row: a mean accuracy of 0.8 for two labels
CLASS_PSEUDO = 1.0


@dataclass(frozen=True)
class Answer:
    item: Hashable
    annotator: str
    label: str


@dataclass(frozen=True)
class AnnotatorModel:
    """A fitted model: the class prior, each annotator's confusion matrix and each item's posterior."""

    labels: list[str]
    class_prior: list[float]
    confusion: dict[str, list[list[float]]]  # annotator -> [true label][answered label]
    posteriors: dict[Hashable, list[float]]  # item -> probability of each label
    iterations: int
    method: str = METHOD
    weights: dict[str, float] = field(default_factory=dict)  # annotator -> weight of their answers (default 1)

    def accuracy(self, annotator: str) -> float:
        """Probability that the annotator answers the true label of an item drawn from the class prior."""
        matrix = self.confusion.get(annotator, prior_confusion(len(self.labels)))
        return float(sum(p * matrix[k][k] for k, p in enumerate(self.class_prior)))

    def posterior(self, answers: Sequence[tuple[str, str]]) -> list[float]:
        """The posterior of an item from (annotator, label) answers under this model (unknown annotators
        get the prior's confusion): what the queue asks after each answer."""
        return posterior_of(self.labels, self.class_prior, self.confusion, answers, self.weights)

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "labels": self.labels,
            "class_prior": self.class_prior,
            "confusion": self.confusion,
            "iterations": self.iterations,
            "weights": self.weights,
        }

    @classmethod
    def from_json(cls, data: dict) -> AnnotatorModel:
        return cls(
            data["labels"],
            data["class_prior"],
            data["confusion"],
            {},
            data["iterations"],
            data["method"],
            data["weights"],
        )

    @classmethod
    def unfitted(cls, labels: list[str]) -> AnnotatorModel:
        """The prior alone: every annotator at the prior's accuracy, the classes equally likely."""
        return cls(labels, [1 / len(labels)] * len(labels), {}, {}, 0)


def prior_confusion(n: int) -> list[list[float]]:
    row_total = CORRECT + WRONG * (n - 1)
    return [[(CORRECT if k == j else WRONG) / row_total for j in range(n)] for k in range(n)]


def posterior_of(
    labels: list[str],
    class_prior: Sequence[float],
    confusion: dict[str, list[list[float]]],
    answers: Sequence[tuple[str, str]],
    weights: dict[str, float],
) -> list[float]:
    log_p = np.log(np.asarray(class_prior, dtype=float))
    default = prior_confusion(len(labels))
    for annotator, label in answers:
        matrix = np.asarray(confusion.get(annotator, default))
        log_p = log_p + weights.get(annotator, 1.0) * np.log(matrix[:, labels.index(label)])
    p = np.exp(log_p - log_p.max())
    return (p / p.sum()).tolist()


def fit(
    answers: Sequence[Answer],
    labels: list[str],
    known: dict[Hashable, str] | None = None,
    weights: dict[str, float] | None = None,
    max_iterations: int = 200,
    tolerance: float = 1e-6,
) -> AnnotatorModel:
    """Dawid-Skene EM from (item, annotator, label) answers. `known`: items whose label is given (gold,
    verdicts). `weights`: annotator -> power on their likelihood in the E step (default 1)."""
    known, weights = known or {}, weights or {}
    items = sorted({a.item for a in answers} | set(known), key=str)
    people = sorted({a.annotator for a in answers})
    row, col = {i: n for n, i in enumerate(items)}, {p: n for n, p in enumerate(people)}
    n_labels = len(labels)
    # counts[i, j, l]: annotator j answered label l on item i
    counts = np.zeros((len(items), len(people), n_labels))
    for a in answers:
        counts[row[a.item], col[a.annotator], labels.index(a.label)] += 1
    weight = np.array([weights.get(p, 1.0) for p in people])
    clamped = np.zeros(len(items), dtype=bool)
    fixed = np.zeros((len(items), n_labels))
    for item, label in known.items():
        clamped[row[item]] = True
        fixed[row[item], labels.index(label)] = 1.0
    posterior = _initial_posterior(counts, weight, clamped, fixed)
    pseudo = np.full((n_labels, n_labels), WRONG) + np.eye(n_labels) * (CORRECT - WRONG)
    iterations = 0
    for iterations in range(1, max_iterations + 1):  # noqa: B007 (the count is reported)
        prior = (posterior.sum(axis=0) + CLASS_PSEUDO) / (len(items) + CLASS_PSEUDO * n_labels)
        # M step: confusion[j, k, l] = expected answers l by j on items whose truth is k, plus pseudo-counts
        confusion = np.einsum("ik,ijl->jkl", posterior, counts) + pseudo
        confusion /= confusion.sum(axis=2, keepdims=True)
        # E step: log prior + each annotator's weighted log-likelihood of what they answered
        log_p = np.log(prior) + np.einsum("ijl,jkl->ik", counts * weight[None, :, None], np.log(confusion))
        updated = np.exp(log_p - log_p.max(axis=1, keepdims=True))
        updated /= updated.sum(axis=1, keepdims=True)
        updated[clamped] = fixed[clamped]
        change = float(np.abs(updated - posterior).max()) if len(items) else 0.0
        posterior = updated
        if change < tolerance:
            break
    return AnnotatorModel(
        labels=list(labels),
        class_prior=prior.tolist(),
        confusion={p: confusion[col[p]].tolist() for p in people},
        posteriors={item: posterior[row[item]].tolist() for item in items},
        iterations=iterations,
        weights={p: weights[p] for p in people if p in weights},
    )


def _initial_posterior(counts: np.ndarray, weight: np.ndarray, clamped: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """Weighted vote shares (Dawid and Skene start from the answer proportions), smoothed so an item with
    no answers starts uniform."""
    votes = np.einsum("ijl,j->il", counts, weight) + 1e-3
    start = votes / votes.sum(axis=1, keepdims=True)
    start[clamped] = fixed[clamped]
    return start
