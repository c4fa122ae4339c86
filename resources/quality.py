from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dagster import ConfigurableResource

from resources.lake import LakeResource

if TYPE_CHECKING:  # the engine is imported when a client is made: the CLIs start without great-expectations
    from engines.quality import QualityEngine


class QualityResource(ConfigurableResource):
    """great-expectations validations and Data Docs, stored in the lake's `quality/` folder."""

    lake: LakeResource

    def get_client(self) -> QualityEngine:
        from engines.quality import QualityEngine

        return QualityEngine(Path(self.lake.root) / "quality")
