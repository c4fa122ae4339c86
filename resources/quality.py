from pathlib import Path

from dagster import ConfigurableResource

from engines.quality import QualityEngine
from resources.lake import LakeResource


class QualityResource(ConfigurableResource):
    """great-expectations validations and Data Docs, stored in the lake's `quality/` folder."""

    lake: LakeResource

    def get_client(self) -> QualityEngine:
        return QualityEngine(Path(self.lake.root) / "quality")
