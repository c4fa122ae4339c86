"""The copy detector's calibration by simulation: a catalogue whose copies are known, a release labelled
the way the queues pick items (a random audit sample and users' reports, which favour copies), the
model, its threshold and their cross-validated estimates; the estimates' 95% intervals must cover the
catalogue's true precision and recall under the fitted rule about as often as they claim."""

import numpy as np

from engines.safety.copy_calibration import Calibration, best_threshold, calibrate, held_out_flags, stratified_folds

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


def truth_of(calibration, similarity, copy):
    """The catalogue's precision and recall under the calibrated model and threshold."""
    flagged = calibration.model.score(similarity[:, None]) >= calibration.threshold
    return (flagged & copy).sum() / max(flagged.sum(), 1), (flagged & copy).sum() / copy.sum()


def test_intervals_cover_the_catalogues_precision_and_recall():
    rng = np.random.default_rng(7)
    covered = {"precision": 0, "recall": 0}
    widths = []
    runs = 100
    for _ in range(runs):
        similarity, copy, labelled, audit = simulated_release(rng)
        features, matched = similarity[labelled, None], np.ones(labelled.sum(), dtype=bool)
        calibration = calibrate(features, matched, copy[labelled], audit[labelled], "v0001", draws=100)
        precision, recall = truth_of(calibration, similarity, copy)
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
        flagged_all = similarity >= threshold
        misses += in_sample > (flagged_all & copy).sum() / flagged_all.sum()
    assert misses / runs > 0.8


def test_a_rows_held_out_flag_ignores_its_own_label():
    """Flipping the label of a row leaves its fold's held-out flags as they were: neither the model nor
    the threshold that flag the fold saw the fold's labels."""
    rng = np.random.default_rng(3)
    features, positive = rng.random((60, 2)), rng.random(60) < 0.3
    features[positive, 0] += 0.4
    matched = np.ones(60, dtype=bool)
    fold = stratified_folds(positive, 5)
    flagged = held_out_flags(features, matched, positive, 5, fold)
    assert flagged[positive].mean() > flagged[~positive].mean()  # the rule has learned something
    for row in np.flatnonzero(fold == 0)[:5]:
        flipped = positive.copy()
        flipped[row] = not flipped[row]
        again = held_out_flags(features, matched, flipped, 5, fold)
        assert again[fold == 0].tolist() == flagged[fold == 0].tolist()


def test_threshold_sits_between_the_classes_and_round_trips(tmp_path):
    similarity = np.array([0.99, 0.98, 0.97, 0.60, 0.50, 0.40])
    positive = np.array([True, True, True, False, False, False])
    assert best_threshold(similarity, positive) == (0.97 + 0.60) / 2
    assert best_threshold(similarity, np.ones(6, dtype=bool)) is None
    calibration = calibrate(similarity[:, None], np.ones(6, dtype=bool), positive, np.ones(6, dtype=bool), "v0002")
    calibration.save(tmp_path)
    assert Calibration.load(tmp_path) == calibration
    assert Calibration.load(tmp_path / "elsewhere") is None


def test_separable_classes_still_get_honest_intervals():
    """Every held-out flag right: the bootstrap collapses to 1.0, the counts' Wilson intervals do not."""
    rng = np.random.default_rng(5)
    positive = np.arange(60) < 12
    similarity = np.where(positive, rng.uniform(0.95, 1.0, 60), rng.uniform(0.3, 0.8, 60))
    audit = np.ones(60, dtype=bool)
    calibration = calibrate(similarity[:, None], np.ones(60, dtype=bool), positive, audit, "v0003", draws=50)
    assert calibration.recall.value == 1.0 and calibration.precision.value == 1.0
    assert 0.7 < calibration.recall.low < 0.8  # Wilson's for 12 of 12
    assert calibration.precision.low < 0.9 and calibration.precision.high == 1.0
