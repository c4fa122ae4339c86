from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import Field

from resources.lake import LakeResource

if TYPE_CHECKING:  # the engine is imported when a client is made: the CLIs start without Feast
    from engines.features.feature_store import FeatureStoreEngine


class FeatureStoreResource(ConfigurableResource):
    """Feast over the lake's offline tables: SQLite online store by default, Redis in production."""

    lake: LakeResource
    project: str = "mlplane"
    online_store: str = Field(default="sqlite", description="'sqlite' or 'redis'")
    redis_url: str = Field(default="localhost:6379", description="Feast Redis connection string")
    registry_url: str | None = Field(default=None, description="SQLAlchemy URL of a SQL registry")

    def get_client(self) -> FeatureStoreEngine:
        from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings

        root = Path(self.lake.root)
        return FeatureStoreEngine(
            FeatureStoreSettings(
                repo_dir=root / "feature_repo",
                offline_root=root / "offline",
                project=self.project,
                online_store=self.online_store,
                redis_url=self.redis_url,
                registry_url=self.registry_url,
            )
        )
