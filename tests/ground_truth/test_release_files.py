"""A release folder is written whole or not at all, and an existing one (even empty) is never replaced."""

from __future__ import annotations

import pytest

from engines.data.releases import releases, releases_dir
from ground_truth import release as rel
from ground_truth import review
from ground_truth.queue import Task
from ground_truth.schema import CONTENT_VIOLATION
from tests.ground_truth.test_quality import state

TASK = Task(1, CONTENT_VIOLATION)


def candidate():
    states = [state(str(i), {"a": "ok", "b": "ok", "c": "ok"}) for i in range(3)]
    return rel.candidate(TASK, states, review.task_quality(None, TASK, states))


def test_an_existing_empty_release_folder_is_refused_not_replaced(tmp_path):
    squatter = releases_dir(tmp_path, TASK.spec.name) / "v0001"
    squatter.mkdir(parents=True)
    with pytest.raises(FileExistsError, match="never replaced"):
        rel.write_release(tmp_path, candidate(), {})
    assert list(squatter.iterdir()) == [] and releases(tmp_path, TASK.spec.name) == []
    assert [p.name for p in squatter.parent.iterdir()] == ["v0001"]  # the staging folder is cleaned up


def test_a_release_is_written_whole(tmp_path):
    written, created = rel.write_release(tmp_path, candidate(), {})
    assert created and written.version == 1 and written.labels().height == 3
    assert rel.write_release(tmp_path, candidate(), {}) == (written, False)  # unchanged labels: no new version


def test_a_release_carries_the_posterior_method_and_alpha_interval(tmp_path):
    """Twelve items of three annotators, two of them split 2:1: each released label's posterior is
    recomputed here from the manifest's fitted model (prior times the confusion entry of each answer)."""
    states = [state(str(i), {"a": "ok", "b": "ok", "c": "ok"}) for i in range(8)]
    states += [state(f"v{i}", {"a": "violation", "b": "violation", "c": "violation"}) for i in range(2)]
    states += [
        state("split0", {"a": "ok", "b": "ok", "c": "violation"}),
        state("split1", {"a": "violation", "b": "ok", "c": "violation"}),
    ]
    found = rel.candidate(TASK, states, review.task_quality(None, TASK, states))
    written, _ = rel.write_release(tmp_path, found, {})
    manifest = written.manifest()
    assert manifest["method"] == "dawid-skene"
    assert "split1" not in written.labels()["key"].to_list()  # 2:1 with the weaker pair: left to a reviewer
    low, high = manifest["agreement"]["krippendorff_alpha_interval"]
    assert low <= manifest["agreement"]["krippendorff_alpha"] <= high
    model = manifest["annotator_model"]
    labels = model["labels"]
    for row in written.labels().iter_rows(named=True):
        odds = list(model["class_prior"])
        for who, answer in zip(row["annotators"], row["answer_labels"]):
            odds = [p * model["confusion"][who][k][labels.index(answer)] for k, p in enumerate(odds)]
        assert row["posterior"] == pytest.approx(odds[labels.index(row["label"])] / sum(odds), abs=1e-6)
        assert row["resolved_by"] == ("model" if row["key"].startswith("split") else "unanimous")
        assert row["posterior"] >= TASK.spec.confidence or row["resolved_by"] == "unanimous"
