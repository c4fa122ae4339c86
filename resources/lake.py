from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from engines.data.lake import Lake


class LakeResource(ConfigurableResource):
    """The data lake: landing, warehouse, offline feature tables, datasets and reports."""

    root: str = Field(description="Folder (or mount) holding every zone of the lake")

    def get_client(self) -> Lake:
        return Lake(Path(self.root))
