"""The copy detector records in the model registry the content_violation release it was fitted on: a
release labelled through the queue, the detector calibrated on the newest release as the flags asset
does, the registry's tag read back; a newer release gives a new version with the newer tag. (The flags
asset itself registers through this: tests/assets/test_embeddings.py reads its version's tag.)"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from engines.data.releases import NO_RELEASE, RELEASES_TAG, Release, releases_tag
from engines.models.registry import ModelRegistry
from engines.safety import content_violation as cv
from engines.safety.copy_calibration import calibrate
from engines.safety.copy_registry import (
    CALIBRATION_TAG,
    MODEL_NAME,
    calibration_json,
    newest_calibration,
    register_calibration,
)
from ground_truth import accounts, queue, review
from ground_truth import release as rel
from ground_truth.db import connect
from ground_truth.schema import CONTENT_VIOLATION, ItemIn
from tests.ground_truth.conftest import make_accounts

# one answer per annotator per item, so every item is labelled after one pass (the adaptive default asks
# for more answers only on split items, which careful annotators never leave)
TASK = CONTENT_VIOLATION.model_copy(update={"adaptive": False, "gold_share": 0.0})
RNG = np.random.default_rng(5)
ITEMS = 60
VIOLATIONS = {i for i in range(1, ITEMS + 1) if i % 6 == 0}
# the best match's verified similarity, the copies higher with overlap (what the flags' matching gives)
SIMILARITY = {i: RNG.normal(0.95 if i in VIOLATIONS else 0.85, 0.04) for i in range(1, ITEMS + 1)}


def label_and_release(lake, engine, task, items: range) -> None:
    """Careful annotators label `items` (the random audit queue) and their labels are released."""
    queue.add_items(engine, task, [ItemIn(key=str(i), queue=cv.AUDIT, title=f"item {i}") for i in items])
    for person in ("annotator0", "annotator1", "annotator2"):
        account = next(a for a in accounts.list_accounts(engine) if a.username == person)
        while (item := queue.serve(engine, task, account.id)) is not None:
            queue.answer(engine, task, account.id, item.item_id, "violation" if int(item.key) in VIOLATIONS else "ok")
    states = review.item_states(engine, task)
    rel.write_release(lake, rel.candidate(task, states, review.task_quality(engine, task, states)), {})


def calibrate_on_newest(lake, registry):
    """What the flags asset does with the newest release: calibrate the copy model on its labels and
    register the calibration with the release."""
    truth = cv.release_truth(lake)
    assert truth is not None
    ids = truth.labels["item_id"].to_list()
    features = np.array([[SIMILARITY[i]] for i in ids])
    calibration = calibrate(
        features,
        np.ones(len(ids), dtype=bool),
        truth.labels["is_violation"].to_numpy(),
        truth.labels["audit"].to_numpy(),
        truth.release.name,
        draws=20,
    )
    assert calibration is not None  # both classes are labelled
    return register_calibration(registry, calibration, truth.release, {"mlplane.dagster_asset": "test"})


def test_each_release_the_detector_was_fitted_on_is_its_registry_tag(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'labels.db'}")
    make_accounts(engine, 3, reviewers=0, admins=0)
    task = queue.create_task(engine, TASK)
    registry = ModelRegistry.local(tmp_path / "registry")
    assert newest_calibration(registry, tmp_path / "served") is None  # nothing to flag with yet

    label_and_release(tmp_path, engine, task, range(1, 37))
    first, new = calibrate_on_newest(tmp_path, registry)
    assert new
    read = registry.get(MODEL_NAME, first.version)
    assert read.tags[RELEASES_TAG] == "content_violation/v0001"
    assert read.tags["mlplane.dagster_asset"] == "test"
    assert read.metrics["labelled_items"] == 36
    # the flags recalibrate daily: the same release gives the same calibration and no new version
    again, new = calibrate_on_newest(tmp_path, registry)
    assert (again.version, new) == (first.version, False)

    label_and_release(tmp_path, engine, task, range(37, ITEMS + 1))
    second, new = calibrate_on_newest(tmp_path, registry)
    assert new and int(second.version) == int(first.version) + 1
    assert registry.get(MODEL_NAME, second.version).tags[RELEASES_TAG] == "content_violation/v0002"
    assert registry.get(MODEL_NAME, second.version).metrics["labelled_items"] == ITEMS
    assert registry.get(MODEL_NAME, first.version).tags[RELEASES_TAG] == "content_violation/v0001"

    # what the model server flags with: the newest version, read back whole (its checksum is the registered one)
    served, version = newest_calibration(registry, tmp_path / "served")
    assert version.version == second.version and served.release == "v0002"
    assert hashlib.sha256(calibration_json(served).encode()).hexdigest() == second.tags[CALIBRATION_TAG]
    engine.dispose()


class Untouched:
    """A registry that fails any use: a refused calibration must not reach the registry."""

    def __getattr__(self, name):
        raise AssertionError(f"the registry was used ({name})")


def test_a_calibration_is_registered_only_with_the_release_it_was_fitted_on(tmp_path):
    ids = sorted(SIMILARITY)
    calibration = calibrate(
        np.array([[SIMILARITY[i]] for i in ids]),
        np.ones(len(ids), dtype=bool),
        np.array([i in VIOLATIONS for i in ids]),
        np.ones(len(ids), dtype=bool),
        "v0002",
        draws=5,
    )
    assert calibration is not None
    with pytest.raises(ValueError, match="fitted on v0002, not content_violation/v0001"):
        register_calibration(Untouched(), calibration, Release(cv.TASK, 1, tmp_path), {})  # type: ignore[arg-type]


def test_the_releases_tag_names_each_release_or_none(tmp_path):
    relevance, violation = Release("recommendation_relevance", 2, tmp_path), Release(cv.TASK, 3, tmp_path)
    assert releases_tag(violation) == {RELEASES_TAG: "content_violation/v0003"}
    assert releases_tag(relevance, violation) == {
        RELEASES_TAG: "recommendation_relevance/v0002,content_violation/v0003"
    }
    assert releases_tag(None) == releases_tag() == {RELEASES_TAG: NO_RELEASE}
