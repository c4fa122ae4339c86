from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field
from sqlalchemy.engine import Engine

from ground_truth.db import connect
from resources.lake import LakeResource


class LabelStoreResource(ConfigurableResource):
    """The ground-truth label store: SQLite in the lake (`ground_truth/labels.db`) by default, a
    PostgreSQL URL in production (the labeling app serves the same database)."""

    lake: LakeResource
    url: str | None = Field(
        default=None, description="SQLAlchemy URL, e.g. postgresql+psycopg2://host/labels; None: SQLite in the lake"
    )

    def database_url(self) -> str:
        if self.url:
            return self.url
        folder = Path(self.lake.root) / "ground_truth"
        folder.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{folder / 'labels.db'}"

    def get_client(self) -> Engine:
        return connect(self.database_url())
