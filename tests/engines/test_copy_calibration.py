"""The copy detector's calibration by simulation: a catalogue whose copies are known, a release labelled
the way the queues pick items (a random audit sample and users' reports, which favour copies), the
threshold and its cross-validated estimates; the estimates' 95% intervals must cover the catalogue's
true precision and recall at the chosen threshold about as often as they claim."""

import numpy as np

from engines.copy_calibration import Calibration, best_threshold, calibrate, held_out_flags, stratified_folds

CATALOGUE, PREVALENCE, AUDIT = 2000, 0.03, 150


def simulated_release(rng):
    """Scores of a catalogue (copies score higher, with overlap) and the rows a release would label."""
    copy = rng.random(CATALOGUE) < PREVALENCE
    similarity = np.where(copy, rng.normal(0.95, 0.03, CATALOGUE), rng.normal(0.82, 0.05, CATALOGUE))
    audit = np.zeros(CATALOGUE, dtype=bool)
    audit[rng.choice(CATALOGUE, AUDIT, replace=False)] = True
    reported = rng.random(CATALOGUE) < np.where(copy, 0.6, 0.02)
    labelled = audit | reported
    return similarity, copy, labelled, audit


def truth_at(threshold, similarity, copy):
    flagged = similarity >= threshold
    return (flagged & copy).sum() / max(flagged.sum(), 1), (flagged & copy).sum() / copy.sum()


def test_intervals_cover_the_catalogues_precision_and_recall():
    rng = np.random.default_rng(7)
    covered = {"precision": 0, "recall": 0}
    widths = []
    runs = 100
    for _ in range(runs):
        similarity, copy, labelled, audit = simulated_release(rng)
        calibration = calibrate(similarity[labelled], copy[labelled], audit[labelled], "v0001")
        precision, recall = truth_at(calibration.threshold, similarity, copy)
        covered["precision"] += calibration.precision.low <= precision <= calibration.precision.high
        covered["recall"] += calibration.recall.low <= recall <= calibration.recall.high
        widths.append(calibration.recall.high - calibration.recall.low)
    assert covered["recall"] / runs >= 0.9, covered
    assert covered["precision"] / runs >= 0.9, covered
    assert np.mean(widths) < 0.5  # conservative, not vacuous


def test_the_former_in_sample_figures_overstate_precision():
    """Precision measured on the release's own rows at the threshold chosen on them (the former metadata):
    the queues' enrichment inflates it, so it misses the catalogue's figure far more often than 5%."""
    rng = np.random.default_rng(8)
    misses, runs = 0, 100
    for _ in range(runs):
        similarity, copy, labelled, _ = simulated_release(rng)
        threshold = best_threshold(similarity[labelled], copy[labelled])
        flagged = similarity[labelled] >= threshold
        in_sample = (flagged & copy[labelled]).sum() / flagged.sum()
        misses += in_sample > truth_at(threshold, similarity, copy)[0]
    assert misses / runs > 0.8


def test_a_rows_held_out_flag_ignores_its_own_label():
    rng = np.random.default_rng(3)
    similarity, positive = rng.random(60), rng.random(60) < 0.3
    flagged = held_out_flags(similarity, positive, folds=5)
    fold = stratified_folds(positive, 5)
    for row in np.flatnonzero(fold == 0)[:5]:
        flipped = positive.copy()
        flipped[row] = not flipped[row]
        others = fold == 0  # the row's fold keeps its threshold whatever the row's own label
        threshold = best_threshold(similarity[fold != 0], flipped[fold != 0])
        assert (similarity[others] >= threshold).tolist() == flagged[others].tolist()


def test_threshold_sits_between_the_classes_and_round_trips(tmp_path):
    similarity = np.array([0.99, 0.98, 0.97, 0.60, 0.50, 0.40])
    positive = np.array([True, True, True, False, False, False])
    assert best_threshold(similarity, positive) == (0.97 + 0.60) / 2
    assert best_threshold(similarity, np.ones(6, dtype=bool)) is None
    calibration = calibrate(similarity, positive, np.ones(6, dtype=bool), "v0002")
    calibration.save(tmp_path)
    assert Calibration.load(tmp_path) == calibration
    assert Calibration.load(tmp_path / "elsewhere") is None
