"""The model repository's load and unload: a version pinned by a load is stated in the index and undone
by a plain load; downloads are deleted when their version stops serving, so loads never grow the disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.models.repository import ModelRepository
from tests.serving.models.conftest import TOWER_ENTRIES


class Stub:
    """A served model that remembers being closed (the repository only loads, swaps and closes it)."""

    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def repository(tower_registry, tmp_path) -> ModelRepository:
    registry, _ = tower_registry  # personalization v1 champion, v2 challenger
    repository = ModelRepository(registry, [TOWER_ENTRIES[0]], lambda entry, folder, info: Stub(), tmp_path / "work")
    repository.refresh()
    yield repository
    repository.close()


def entry(repository: ModelRepository) -> dict:
    return repository.index_of("personalization").model_dump(include={"version", "follows", "overridden"})


def test_a_pinned_version_is_stated_and_a_plain_load_follows_the_alias_again(repository):
    assert entry(repository) == {"version": "1", "follows": "alias 'champion'", "overridden": False}
    repository.load("personalization", {"version": "2"})
    pinned = {"version": "2", "follows": "version 2", "overridden": True}
    assert entry(repository) == pinned
    repository.refresh()  # the alias poller keeps the pin
    assert entry(repository) == pinned
    repository.load("personalization")
    assert entry(repository) == {"version": "1", "follows": "alias 'champion'", "overridden": False}


def test_ten_loads_leave_one_download_folder(repository, tmp_path):
    downloads = tmp_path / "work" / "personalization"
    for i in range(10):
        if i % 3 == 2:
            repository.unload("personalization")
        repository.load("personalization", {"version": str(1 + i % 2)})
        folders = list(downloads.iterdir())
        assert len(folders) == 1, folders
        assert any(Path(folders[0]).rglob("*.pt")), "the serving version's files are kept"
    serving = repository.states["personalization"].current
    repository.unload("personalization")
    assert serving.model.closed and not any(downloads.iterdir())
