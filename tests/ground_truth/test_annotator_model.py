"""The Dawid-Skene annotator model and alpha's bootstrap interval, checked against independent
recomputations and against simulated truth (known confusion matrices, known alpha)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ground_truth import annotator_model as am
from ground_truth.agreement import krippendorff_alpha, krippendorff_alpha_interval

LABELS = ["violation", "ok"]


def simulated_answers(seed: int, items: int, confusion: dict[str, list[list[float]]], prevalence: float):
    """Each annotator answers every item, drawing from their row of the true label (0: violation, 1: ok)."""
    rng = random.Random(seed)
    truth = {f"i{n}": 0 if rng.random() < prevalence else 1 for n in range(items)}
    answers = []
    for item, true in truth.items():
        for person, matrix in confusion.items():
            answers.append(am.Answer(item, person, LABELS[0 if rng.random() < matrix[true][0] else 1]))
    return truth, answers


def test_the_confusion_matrices_and_class_prior_are_recovered():
    """Five annotators with known, asymmetric confusion matrices over 2,000 items: the estimates land near
    the truth, and the posteriors' labels beat the majority vote."""
    confusion = {
        "sharp": [[0.95, 0.05], [0.02, 0.98]],
        "lenient": [[0.60, 0.40], [0.05, 0.95]],  # misses violations
        "strict": [[0.97, 0.03], [0.30, 0.70]],  # sees violations everywhere
        "fair0": [[0.80, 0.20], [0.20, 0.80]],
        "fair1": [[0.75, 0.25], [0.15, 0.85]],
    }
    truth, answers = simulated_answers(1, 2000, confusion, prevalence=0.3)
    model = am.fit(answers, LABELS)
    assert model.class_prior[0] == pytest.approx(sum(t == 0 for t in truth.values()) / len(truth), abs=0.02)
    for person, matrix in confusion.items():
        assert np.allclose(model.confusion[person], matrix, atol=0.05), person
    votes: dict[str, list[str]] = {}
    for a in answers:
        votes.setdefault(a.item, []).append(a.label)
    majority = sum(LABELS.index(max(set(v), key=v.count)) == truth[i] for i, v in votes.items())
    modelled = sum(int(np.argmax(model.posteriors[i])) == truth[i] for i in truth)
    assert modelled > majority


def test_posteriors_are_the_e_step_of_the_fitted_parameters():
    """Recomputed by hand from the fitted prior and confusion matrices: prior times each answer's
    confusion entry, normalised (a fixed point of EM)."""
    confusion = {"a": [[0.9, 0.1], [0.2, 0.8]], "b": [[0.7, 0.3], [0.1, 0.9]], "c": [[0.8, 0.2], [0.3, 0.7]]}
    truth, answers = simulated_answers(2, 300, confusion, prevalence=0.4)
    model = am.fit(answers, LABELS, tolerance=1e-12, max_iterations=2000)
    for item in list(truth)[:20]:
        given = [(a.annotator, a.label) for a in answers if a.item == item]
        by_hand = [model.class_prior[k] for k in range(2)]
        for person, label in given:
            by_hand = [p * model.confusion[person][k][LABELS.index(label)] for k, p in enumerate(by_hand)]
        assert model.posteriors[item] == pytest.approx([p / sum(by_hand) for p in by_hand], abs=1e-6)
        assert model.posterior(given) == pytest.approx(model.posteriors[item], abs=1e-6)


def test_few_answers_never_give_a_certain_confusion():
    """An annotator seen on two items who got both right keeps a confusion strictly inside (0, 1): with
    maximum likelihood alone their answer would be certain."""
    answers = [am.Answer("x", "new", "ok"), am.Answer("y", "new", "violation")]
    model = am.fit(answers, LABELS, known={"x": "ok", "y": "violation"})
    for row in model.confusion["new"]:
        assert all(0.05 < p < 0.95 for p in row)
    assert max(model.posterior([("new", "ok")])) < 0.95


def test_known_labels_hold_and_weights_move_posteriors_less():
    answers = [am.Answer("g", "a", "violation"), am.Answer("g", "b", "violation"), am.Answer("q", "a", "ok")]
    model = am.fit(answers, LABELS, known={"g": "ok"})
    assert model.posteriors["g"] == [0.0, 1.0]  # the gold key, whatever the answers say
    full = am.fit([am.Answer("z", "w", "violation")], LABELS)
    halved = am.fit([am.Answer("z", "w", "violation")], LABELS, weights={"w": 0.5})
    assert 0.5 < halved.posteriors["z"][0] < full.posteriors["z"][0]
    assert halved.weights == {"w": 0.5}
    stored = am.AnnotatorModel.from_json(halved.to_json())
    assert stored.posterior([("w", "violation")]) == pytest.approx(halved.posterior([("w", "violation")]))


def test_alpha_interval_holds_the_population_alpha():
    """Units drawn from one process (3 raters of 85% accuracy, 30% positives): the alpha of 50,000 units
    stands in for the population's; 95% bootstrap intervals from 200-unit samples hold it in >= 88 of 100."""
    rng = np.random.default_rng(5)

    def units(n: int) -> list[list[int]]:
        truth = rng.random(n) < 0.3
        right = rng.random((n, 3)) < 0.85
        return np.where(right, truth[:, None], ~truth[:, None]).astype(int).tolist()

    population = krippendorff_alpha(units(50_000))
    held = 0
    for seed in range(100):
        sample = units(200)
        low, high = krippendorff_alpha_interval(sample, resamples=500, seed=seed)
        assert low <= krippendorff_alpha(sample) <= high
        held += low <= population <= high
    assert held >= 88
    assert krippendorff_alpha_interval([["a", "a"], ["a"]]) is None  # one category: no alpha, no interval
