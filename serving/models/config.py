"""The model server's settings: where the registry, lake, feature store and vector database are, which
registry models it serves under which names, and how it batches and samples.

`ServerConfig.local(data_dir)` is the embedded default over one lake folder; a YAML file (the same
fields) configures production: `mlplane serve models --config server.yaml`.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, Field, model_validator

from engines.models.kinds import KINDS


class ModelEntry(BaseModel):
    """One served model: the OIP name clients use, the registry model and the alias or version it follows."""

    name: str
    registry_model: str
    kind: str
    alias: str | None = "champion"
    version: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelEntry:
        if self.kind not in KINDS:
            raise ValueError(f"model {self.name!r}: kind must be one of {tuple(KINDS)}, not {self.kind!r}")
        if self.version is not None:
            self.alias = None
        if self.alias is None and self.version is None:
            raise ValueError(f"model {self.name!r}: give an alias or a version")
        return self

    @property
    def follows(self) -> str:
        return f"alias {self.alias!r}" if self.alias else f"version {self.version}"


VISION_CAPTIONER = ModelEntry(name="vision_captioner", registry_model="vision_captioner", kind="vision_llm")


class BatchingConfig(BaseModel):
    max_batch: int = Field(default=32, ge=1, description="Largest batch an encoder call takes")
    max_delay_ms: float = Field(default=2.0, ge=0, description="How long the first request waits for others")


class ServerConfig(BaseModel):
    registry_root: str | None = Field(default=None, description="Local MLflow folder (mlflow.db, artifacts)")
    tracking_uri: str | None = Field(default=None, description="MLflow tracking URI; overrides registry_root")
    lake_root: str = Field(description="The lake (item catalogue, embeddings, served-feature logs)")
    feature_repo: str | None = Field(default=None, description="Feast repo folder (default: <lake>/feature_repo)")
    online_store: str = "sqlite"
    redis_url: str = "localhost:6379"
    feast_registry_url: str | None = None
    vector_store: str | None = Field(
        default=None, description="Folder (Qdrant Edge) or http(s) URL; default <lake>/serving/vectors"
    )
    workdir: str | None = Field(default=None, description="Where model artifacts are downloaded")
    models: list[ModelEntry] = []
    recommend_model: str = Field(default="personalization", description="Served two-tower model `recommend` uses")
    feature_service: str = Field(
        default="personalization_ranking", description="Fallback when a model version names no feature service"
    )
    candidates: int = Field(default=100, ge=1, description="Items retrieved from the vector DB before reranking")
    poll_interval_s: float = Field(default=2.0, gt=0, description="How often aliases are re-read")
    feature_log_sample: float = Field(
        default=0.05, ge=0, le=1, description="Share of answers whose features are logged for the skew check"
    )
    experiments_file: str | None = Field(
        default=None,
        description="deploy/experiments.yaml: A/B variants and shadows of the recommend model; re-read on change",
    )
    prediction_log: bool = Field(default=True, description="Log every answer to <lake>/serving/prediction_log_spool")
    prediction_log_spill: str | None = Field(
        default=None, description="Where records wait while the lake is unwritable (default <workdir>/log_spill)"
    )
    prediction_log_flush_s: float = Field(default=1.0, gt=0)
    prediction_log_max_backlog: int = Field(
        default=500_000, ge=1, description="Unwritten records past which answers are refused (503)"
    )
    shadow_workers: int = Field(default=2, ge=1)
    shadow_max_pending: int = Field(default=1000, ge=1, description="Shadow copies queued before more are skipped")
    batching: BatchingConfig = BatchingConfig()
    device: str = Field(default="cpu", description="'cpu' or 'cuda'")
    max_body_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1, description="Larger request bodies are refused (413) before they are read"
    )
    max_image_pixels: int = Field(
        default=4096 * 4096,
        ge=1,
        description="An image input whose header declares more pixels is refused (413) before it is decoded",
    )
    admin_key_env: str = Field(
        default="MLPLANE_MODEL_SERVER_ADMIN_KEY",
        description="The environment variable holding the key of control calls (repository load and unload); "
        "unset: they are refused",
    )
    data_key_env: str = Field(
        default="MLPLANE_MODEL_SERVER_KEY",
        description="The environment variable holding the key of data-plane calls; unset: they are open",
    )
    keys_file: str | None = Field(
        default=None,
        description="Named keys made by `mlplane models keys` (digests only; default "
        "<lake>/serving/model_server_keys.json), re-read when it changes",
    )

    @classmethod
    def local(cls, data_dir: str | Path, vision: bool = False, **overrides) -> ServerConfig:
        """Every platform model from the lake's local registry, champion and challenger; with `vision`,
        also `vision_captioner` (a chat model on /v1/chat/completions, trained only on request)."""
        root = Path(data_dir)
        models = [
            ModelEntry(name="personalization", registry_model="personalization", kind="two_tower"),
            ModelEntry(
                name="personalization-challenger",
                registry_model="personalization",
                kind="two_tower",
                alias="challenger",
            ),
            ModelEntry(name="clip_text", registry_model="clip", kind="clip_text"),
            ModelEntry(name="clip_image", registry_model="clip", kind="clip_image"),
            ModelEntry(name="content_violation", registry_model="clip", kind="content_violation"),
            ModelEntry(name="item_search", registry_model="clip", kind="item_search"),
        ]
        if vision:
            models.append(VISION_CAPTIONER)
        return cls(registry_root=str(root / "registry"), lake_root=str(root), models=models, **overrides)

    @classmethod
    def from_yaml(cls, path: str | Path) -> ServerConfig:
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})

    def lake_path(self) -> Path:
        return Path(self.lake_root)

    def vector_location(self) -> str:
        return self.vector_store or str(self.lake_path() / "serving" / "vectors")

    def work_path(self) -> Path:
        return Path(self.workdir) if self.workdir else self.lake_path() / "serving" / "models"

    def keys_path(self) -> Path:
        return Path(self.keys_file) if self.keys_file else self.lake_path() / "serving" / "model_server_keys.json"

    def spill_path(self) -> Path:
        return Path(self.prediction_log_spill) if self.prediction_log_spill else self.work_path() / "log_spill"
