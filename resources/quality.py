from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from dagster import ConfigurableResource

from resources.lake import LakeResource

if TYPE_CHECKING:  # the engine is imported when a client is made: the CLIs start without great-expectations
    from engines.data.quality import QualityEngine


class QualityResource(ConfigurableResource):
    """great-expectations validations and Data Docs, stored in the lake's `quality/` folder."""

    lake: LakeResource

    def get_client(self) -> QualityEngine:
        return _engine(Path(self.lake.root).resolve() / "quality")


@functools.lru_cache(maxsize=8)
def _engine(root: Path) -> QualityEngine:
    """One engine per project in a process, shared by its runs: its GX context stays open and its suites
    registered (an engine serializes its threads' validations on the project's lock)."""
    from engines.data.quality import QualityEngine

    return QualityEngine(root)
