"""A release folder is written whole or not at all, and an existing one (even empty) is never replaced."""

from __future__ import annotations

import pytest

from engines.releases import releases, releases_dir
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
