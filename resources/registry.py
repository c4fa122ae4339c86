from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dagster import ConfigurableResource
from pydantic import Field

if TYPE_CHECKING:  # the engine is imported when a client is made: the CLIs start without MLflow
    from engines.models.registry import ModelRegistry


class ModelRegistryResource(ConfigurableResource):
    """The MLflow model registry: an SQLite store and artifact folder under `root` by default, or a
    tracking URI (an MLflow server, or a PostgreSQL backend store) in production."""

    root: str | None = Field(default=None, description="Local folder for mlflow.db and artifacts (embedded default)")
    tracking_uri: str | None = Field(default=None, description="MLflow tracking/registry URI; overrides `root`")
    artifact_root: str | None = Field(default=None, description="Where new runs store artifacts (with tracking_uri)")
    promotion_margin: float = Field(
        default=0.01,
        ge=0,
        description="The largest loss against the champion on any gated held-out metric (AUC, recall@k, "
        "NDCG@k) a challenger may show and still be promoted (non-inferiority margin, one-sided 2.5%); it must "
        "also be better on the gate metric (AUC) at that level",
    )

    def get_client(self) -> ModelRegistry:
        from engines.models.registry import ModelRegistry

        if self.tracking_uri:
            return ModelRegistry(self.tracking_uri, self.artifact_root)
        if not self.root:
            raise ValueError("ModelRegistryResource needs `root` (local) or `tracking_uri` (a server or database)")
        return ModelRegistry.local(Path(self.root))
