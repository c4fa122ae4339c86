"""The copy scorer by simulation: a catalogue drawn with the simulator's own thumbnail renderer, whose
copies are known (disguised near-copies of another creator's earlier item, as the simulator makes them),
with lookalikes (the same category, colour and material drawn anew) and creators re-uploading their own
designs after another creator copied them (not a violation, yet nearly identical to an earlier item of
another creator). Releases are labelled the way the queues pick items (a random audit sample and users'
reports); the copy model and the single similarity cut are each fitted on a release and scored on the
whole catalogue against the truth."""

from datetime import datetime, timedelta

import numpy as np
import polars as pl
import pytest
from scipy.optimize import minimize

from engines.safety import copy_model
from engines.safety.copy_calibration import best_threshold, fitted_rule
from engines.safety.copy_match import match_originals
from engines.safety.copy_model import FEATURES, copy_features, fit, fit_many
from simulator.thumbnails import SHAPES, perturb, render
from simulator.vocabulary import COLOURS, MATERIALS

ITEMS, CREATORS, COPIES, REUPLOADS = 500, 50, 30, 20
RELEASES, AUDIT = 12, 100


def stand_in_embedding(image: np.ndarray) -> np.ndarray:
    """What CLIP's candidate stage needs: what the image shows, coarsely (8 x 8 colour blocks, unit norm)."""
    blocks = image.astype(np.float32).reshape(8, 8, 8, 8, 3).mean(axis=(1, 3)).ravel()
    blocks -= blocks.mean()
    return blocks / np.linalg.norm(blocks)


def simulated_catalogue(seed: int = 0):
    """(items: item_id, creator_id, created_at, image_embedding; pixels; is_copy; is_reupload)."""
    rng = np.random.default_rng(seed)
    designs = [
        (rng.choice(list(SHAPES)), rng.choice(list(COLOURS)), rng.choice(MATERIALS), int(rng.integers(2**31)))
        for _ in range(ITEMS)
    ]
    creator = rng.integers(0, CREATORS, ITEMS)
    kind = np.array(["own"] * ITEMS, dtype=object)
    later = np.arange(ITEMS // 2, ITEMS)
    copies = rng.choice(later, COPIES, replace=False)
    copied_from = {}
    for row in copies:
        source = int(rng.integers(0, ITEMS // 4))
        copied_from[row] = source
        designs[row] = designs[source]
        creator[row] = (creator[source] + 1 + rng.integers(0, CREATORS - 1)) % CREATORS
        kind[row] = "copy"
    # a creator re-uploads a design of theirs that another creator copied earlier
    after_a_copy = np.setdiff1d(np.arange(copies.min() + 1, ITEMS), copies)
    for row in rng.choice(after_a_copy, REUPLOADS, replace=False):
        copy = int(rng.choice(copies[copies < row]))
        source = copied_from[copy]
        designs[row], creator[row], kind[row] = designs[source], creator[source], "reupload"
    pixels = {}
    for row, (shape, colour, material, seed_) in enumerate(designs):
        image = render(str(shape), str(colour), str(material), seed_).astype(np.float32)
        if kind[row] == "copy":
            image = perturb(image.astype(np.uint8), int(rng.integers(2**31))).astype(np.float32)
        elif kind[row] == "reupload":  # the same file exported again
            image = np.clip(image + rng.normal(0, 3, image.shape), 0, 255)
        pixels[row] = image
    start = datetime(2026, 1, 1)
    items = pl.DataFrame(
        {
            "item_id": list(range(ITEMS)),
            "creator_id": creator.tolist(),
            "created_at": [start + timedelta(hours=row) for row in range(ITEMS)],
            "image_embedding": [stand_in_embedding(pixels[row]).tolist() for row in range(ITEMS)],
        },
        schema_overrides={"image_embedding": pl.List(pl.Float32)},
    )
    return items, pixels, kind == "copy", kind == "reupload"


@pytest.fixture(scope="module")
def catalogue():
    items, pixels, is_copy, is_reupload = simulated_catalogue()
    matches = match_originals(items, items, pixels).sort("item_id")
    return matches, is_copy, is_reupload


def precision_recall(flagged: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    hits = (flagged & truth).sum()
    return hits / max(flagged.sum(), 1), hits / truth.sum()


def test_the_model_beats_the_single_similarity_cut(catalogue):
    """Over releases drawn as the queues draw them, the model's precision on the catalogue is higher and
    its recall no lower than the best-F1 cut on similarity alone, each fitted on the same release."""
    matches, is_copy, is_reupload = catalogue
    features, matched = copy_features(matches)
    similarity = matches["similarity"].fill_null(-np.inf).to_numpy()
    # the simulated world has what the cut cannot tell apart: re-uploads matching another creator's copy
    assert (similarity[is_reupload] > np.quantile(similarity[is_copy], 0.1)).mean() > 0.5
    rng = np.random.default_rng(1)
    model, cut = [], []
    for _ in range(RELEASES):
        audit = np.zeros(ITEMS, dtype=bool)
        audit[rng.choice(ITEMS, AUDIT, replace=False)] = True
        labelled = audit | (rng.random(ITEMS) < np.where(is_copy, 0.3, 0.03))  # users report copies more
        rule = fitted_rule(features[labelled], matched[labelled], is_copy[labelled])
        model.append(precision_recall(rule.flags(features, matched), is_copy))
        threshold = best_threshold(similarity[labelled], is_copy[labelled])
        cut.append(precision_recall(similarity >= threshold, is_copy))
    model, cut = np.mean(model, axis=0), np.mean(cut, axis=0)
    print(f"copy model precision {model[0]:.3f} recall {model[1]:.3f}; similarity cut {cut[0]:.3f} {cut[1]:.3f}")
    assert model[0] > cut[0] + 0.1, (model, cut)
    assert model[1] >= cut[1] - 0.02, (model, cut)


def test_features_of_a_match():
    matches = pl.DataFrame(
        {
            "item_id": [1, 2, 3],
            "similarity": [0.99, 0.9, None],
            "margin": [0.2, None, None],
            "days_after_original": [3.0, 0.5, None],
            "own_similarity": [0.5, 0.95, None],
        }
    )
    features, matched = copy_features(matches)
    assert matched.tolist() == [True, True, False]
    assert FEATURES == ("nines", "log_margin", "other_creator_best", "log_days_after_original")
    assert features[0] == pytest.approx([-np.log(0.01), np.log(0.21), 1.0, np.log(4.0)])
    assert features[1] == pytest.approx([-np.log(0.1), np.log(0.91), 0.0, np.log(1.5)])  # no rival: margin = it
    assert features[2].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_fit_is_the_penalized_maximum_likelihood():
    """Newton's solution against scipy's minimizer of the same objective (standardized features, L2 on the
    weights, not the bias)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 3)) * [1.0, 5.0, 0.2] + [0.0, 2.0, -1.0]
    y = rng.random(300) < 1 / (1 + np.exp(-(x @ [1.5, -0.3, 4.0] - 0.5)))
    model = fit(x, y, penalty=2.0, names=("a", "b", "c"))
    z = (x - x.mean(axis=0)) / x.std(axis=0)

    def objective(w):
        logits = w[0] + z @ w[1:]
        return np.sum(np.logaddexp(0, logits) - y * logits) + 2.0 / 2 * np.sum(w[1:] ** 2)

    best = minimize(objective, np.zeros(4), method="BFGS", options={"gtol": 1e-8}).x
    assert model.bias == pytest.approx(best[0], abs=1e-4)
    assert model.weights == pytest.approx(best[1:], abs=1e-4)
    expected = 1 / (1 + np.exp(-(best[0] + z @ best[1:])))
    assert model.score(x) == pytest.approx(expected, abs=1e-5)


def test_fit_many_is_fit_on_each_resample(monkeypatch):
    """Models fitted together from row counts equal `fit` on the rows repeated that often (a bootstrap
    resample, a fold left out), also when the batch is split to bound memory."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(120, 2))
    y = rng.random(120) < 1 / (1 + np.exp(-(3 * x[:, 0] - 1)))
    samples = [rng.integers(0, 120, 120) for _ in range(5)] + [np.flatnonzero(np.arange(120) % 5 != 0)]
    counts = np.array([np.bincount(s, minlength=120) for s in samples])
    for batch in (copy_model.BATCH_CELLS, 120 * 3 * 2):  # all at once; two models at a time
        monkeypatch.setattr(copy_model, "BATCH_CELLS", batch)
        together = fit_many(x, y, counts, names=("a", "b"))
        for sample, model in zip(samples, together, strict=True):
            alone = fit(x[sample], y[sample], names=("a", "b"))
            assert model.mean == pytest.approx(alone.mean) and model.scale == pytest.approx(alone.scale)
            assert model.weights == pytest.approx(alone.weights, abs=1e-7)
            assert model.bias == pytest.approx(alone.bias, abs=1e-7)
