"""The model server's core, shared by the REST and gRPC front ends: the repository of registry models,
inference with checks and metrics, `recommend` and the online feature store."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from engines.data.lake import Lake
from engines.experimentation.prediction_logs import LIVE, PredictionRecord
from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings
from engines.models.registry import ModelRegistry, RegisteredVersion
from engines.retrieval.vector_store import VectorStore
from serving.models.auth import Keys
from serving.models.config import ModelEntry, ServerConfig
from serving.models.hooks.experiments import ExperimentRouter
from serving.models.hooks.feature_log import FeatureLog
from serving.models.hooks.prediction_log import LiveAnswers, PredictionLog
from serving.models.hooks.shadow import ShadowRunner
from serving.models.kinds.base import ServedModel
from serving.models.kinds.recommend import Answer, Candidates, Recommender, UserFeatures, is_int64
from serving.models.kinds.towers import load_two_tower
from serving.models.metrics import ServerMetrics
from serving.models.protocols.protocol import ProtocolError, TensorSpec, check_inputs
from serving.models.repository import ModelRepository

FEATURE_SERVICE_TAG = "mlplane.feature_service"
RECOMMEND_MODEL = "recommend"  # the OIP name of recommend(user_id, k, context)
SERVER_NAME, SERVER_VERSION = "mlplane-models", "0.1.0"
EXTENSIONS = ["model_repository", "binary_tensor_data", "statistics"]


class ModelServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.keys = Keys.of(config)
        self.metrics = ServerMetrics()
        self.lake = Lake(config.lake_path())
        self.registry = (
            ModelRegistry(config.tracking_uri)
            if config.tracking_uri
            else ModelRegistry.local(Path(config.registry_root or config.lake_path() / "registry"))
        )
        self.feature_store = FeatureStoreEngine(
            FeatureStoreSettings(
                repo_dir=Path(config.feature_repo or config.lake_path() / "feature_repo"),
                offline_root=config.lake_path() / "offline",
                online_store=config.online_store,
                redis_url=config.redis_url,
                registry_url=config.feast_registry_url,
            )
        )
        self.vectors = Candidates(VectorStore.open(config.vector_location()))
        self.repository = ModelRepository(self.registry, config.models, self._load, config.work_path())
        self.feature_log = FeatureLog(config.lake_path(), config.feature_log_sample)
        self.prediction_log = (
            PredictionLog(
                config.lake_path(),
                config.spill_path(),
                config.prediction_log_flush_s,
                max_backlog=config.prediction_log_max_backlog,
                on_state=self.metrics.log_state,
            )
            if config.prediction_log
            else None
        )
        self.experiments = ExperimentRouter(  # each file it routes with is stored beside the logs
            Path(config.experiments_file) if config.experiments_file else None,
            self.repository,
            config.recommend_model,
            self.prediction_log.keep_config if self.prediction_log else None,
        )
        self.recommender = Recommender(
            self.repository,
            UserFeatures(self.feature_store),
            self.vectors,
            self.metrics,
            config.recommend_model,
            config.candidates,
            choose_variant=self.experiments.choose,
        )
        self.shadows = ShadowRunner(
            self.experiments.shadows,
            self.recommender,
            self._log,
            self.metrics,
            config.shadow_workers,
            config.shadow_max_pending,
        )
        live = [LiveAnswers(self.prediction_log)] if self.prediction_log else []
        self.recommender.on_answer = [*live, self.shadows, self.feature_log]

    def start(self) -> None:
        """Load every entry's version now (failures are reported per model), then follow the aliases."""
        self.repository.refresh()
        self.experiments.reload()
        self.repository.start(self.config.poll_interval_s)
        self.experiments.start(self.config.poll_interval_s)

    def _log(self, record: PredictionRecord) -> None:
        if self.prediction_log is not None:
            self.prediction_log.submit(record)

    def close(self) -> None:
        self.experiments.stop()
        self.repository.stop()
        self.shadows.close()  # shadows in flight log their answers before the log closes
        if self.prediction_log is not None:
            self.prediction_log.close()
        self.feature_log.close()
        self.repository.close()
        self.vectors.store.close()

    # --- loading --------------------------------------------------------------------------------
    def _load(self, entry: ModelEntry, folder: Path, version: RegisteredVersion) -> ServedModel:
        served = self._load_kind(entry, folder, version)
        served.log_inputs = version.log_inputs
        return served

    def _load_kind(self, entry: ModelEntry, folder: Path, version: RegisteredVersion) -> ServedModel:
        loader = self.LOADERS.get(entry.kind)
        if loader is None:
            raise ValueError(f"unknown model kind {entry.kind!r}")
        return loader(self, entry, folder, version)

    def _load_two_tower(self, entry: ModelEntry, folder: Path, version: RegisteredVersion) -> ServedModel:
        service = version.tags.get(FEATURE_SERVICE_TAG) or self.config.feature_service
        served, rows = load_two_tower(folder, self.lake, service)
        if rows is not None:  # candidates for recommend, indexed before the version serves
            self.vectors.index(served, rows, version.version)
        return served

    def _load_clip(self, entry: ModelEntry, folder: Path, version: RegisteredVersion) -> ServedModel:
        from serving.models.kinds.encoders import ClipEncoder

        observer = self.metrics.batch_observer(entry.name)
        tower = entry.kind.removeprefix("clip_")
        config = self.config
        return ClipEncoder(folder, tower, config.batching, config.device, observer, config.max_image_pixels)

    def _load_content_violation(self, entry: ModelEntry, folder: Path, version: RegisteredVersion) -> ServedModel:
        from engines.safety.copy_registry import newest_calibration
        from serving.models.kinds.encoders import ContentViolationScorer

        observer, config = self.metrics.batch_observer(entry.name), self.config
        newest = newest_calibration(self.registry, config.work_path())  # the one the batch flags registered last
        detector = (newest[0], newest[1].version) if newest else None
        return ContentViolationScorer(
            folder, self.lake, config.batching, config.device, observer, config.max_image_pixels, detector
        )

    def _load_item_search(self, entry: ModelEntry, folder: Path, version: RegisteredVersion) -> ServedModel:
        from serving.models.kinds.search import ItemSearchModel

        location = self.config.vector_location()  # a server's, or the version's own folder (one process's)
        local = not location.startswith(("http://", "https://"))
        return ItemSearchModel(folder, self.lake, str(folder / "index") if local else location, version.version)

    def _load_vision_llm(self, entry: ModelEntry, folder: Path, version: RegisteredVersion) -> ServedModel:
        from serving.models.kinds.captioner import VisionCaptioner

        return VisionCaptioner(folder, self.config.device, self.config.max_image_pixels)

    LOADERS = {  # one per kind of engines/models/kinds.py
        "two_tower": _load_two_tower,
        "clip_text": _load_clip,
        "clip_image": _load_clip,
        "content_violation": _load_content_violation,
        "item_search": _load_item_search,
        "vision_llm": _load_vision_llm,
    }

    # --- inference --------------------------------------------------------------------------------
    async def infer(
        self, name: str, version: str | None, inputs: dict[str, np.ndarray], parameters: dict, protocol: str
    ) -> tuple[str, str, dict[str, np.ndarray]]:
        """(model name, version, outputs); ProtocolError for what the client got wrong."""
        started = time.perf_counter()
        try:
            if name == RECOMMEND_MODEL:
                version_served, outputs = await self._recommend_tensors(inputs, parameters)
            else:
                loaded = self.repository.get(name, version)
                check_inputs(name, loaded.model.inputs, inputs)
                outputs = await loaded.model.infer_async(inputs, parameters)
                version_served = loaded.version
        except ProtocolError as error:
            self.metrics.error(name if name in self.model_names() else "unknown", error.status)
            raise
        seconds = time.perf_counter() - started
        self.metrics.observe(name, version_served, protocol, seconds)
        if name != RECOMMEND_MODEL:  # recommend answers are logged by their own hook
            self._log_infer(name, version_served, inputs, outputs, parameters, seconds)
        return name, version_served, outputs

    def _log_infer(
        self, name: str, version: str, inputs: dict, outputs: dict, parameters: dict, seconds: float
    ) -> None:
        if self.prediction_log is None:
            return
        user = parameters.get("user_id")
        state = self.repository.states[name]
        entry, loaded = state.entry, state.current
        self.prediction_log.submit(
            PredictionRecord(
                request_id=str(parameters.get("request_id") or uuid.uuid4().hex),
                served_at=datetime.now(UTC),
                role=LIVE,
                endpoint=name,
                user_id=user if is_int64(user) else None,  # a raw parameter: logged only if a lake column holds it
                experiment="",
                variant=name,
                assignments={},
                served_model=name,
                registry_model=entry.registry_model,
                model_version=version,
                k=None,
                inputs_hash="",
                latency_ms=seconds * 1000,
                tensors=(inputs, outputs),
                tensor_inputs_allowed=bool(loaded and loaded.model.log_inputs),
            )
        )

    def model_names(self) -> list[str]:
        return [*self.repository.states, RECOMMEND_MODEL]

    def check_model(self, name: str, version: str | None) -> None:
        """The refusal a request to this model gets whatever its body (unknown name or version, not
        loaded), so that the body need not be read or decoded first."""
        if name == RECOMMEND_MODEL:
            return
        try:
            self.repository.get(name, version)
        except ProtocolError as error:
            self.metrics.error(name if name in self.model_names() else "unknown", error.status)
            raise

    async def _recommend_tensors(self, inputs: dict[str, np.ndarray], parameters: dict):
        from starlette.concurrency import run_in_threadpool

        check_inputs(RECOMMEND_MODEL, RECOMMEND_INPUTS, inputs)
        users = inputs["user_id"].tolist()
        if not isinstance(parameters.get("context") or {}, dict):
            raise ProtocolError(400, "parameter 'context' must be an object")
        k = int(inputs["k"][0]) if "k" in inputs else parameters.get("k", 10)  # checked by recommend
        answers = [await run_in_threadpool(self.recommender.recommend, u, k, parameters.get("context")) for u in users]
        width = max((len(a.item_ids) for a in answers), default=0)
        items = np.full((len(answers), width), -1, np.int64)
        scores = np.full((len(answers), width), np.nan, np.float32)
        for row, answer in enumerate(answers):
            items[row, : len(answer.item_ids)] = answer.item_ids
            scores[row, : len(answer.scores)] = answer.scores
        versions = np.array([a.model_version.encode() for a in answers], dtype=object)
        version = answers[0].model_version if answers else ""
        return version, {"item_ids": items, "scores": scores, "model_version": versions}

    async def recommend(self, user_id: int, k: int, context: dict | None, request_id: str | None) -> Answer:
        from starlette.concurrency import run_in_threadpool

        started = time.perf_counter()
        try:
            answer = await run_in_threadpool(self.recommender.recommend, user_id, k, context, request_id)
        except ProtocolError as error:
            self.metrics.error(RECOMMEND_MODEL, error.status)
            raise
        self.metrics.observe(RECOMMEND_MODEL, answer.model_version, "rest", time.perf_counter() - started)
        return answer

    def metadata(self, name: str, version: str | None) -> dict:
        if name == RECOMMEND_MODEL:
            loaded = self.repository.get(self.config.recommend_model)
            return {
                "name": name,
                "versions": [loaded.version],
                "platform": "mlplane_recommend",
                "inputs": [s.metadata().model_dump() for s in RECOMMEND_INPUTS],
                "outputs": [s.metadata().model_dump() for s in RECOMMEND_OUTPUTS],
                "parameters": {"serves": self.config.recommend_model},
            }
        loaded = self.repository.get(name, version)
        model = loaded.model
        return {
            "name": name,
            "versions": [loaded.version],
            "platform": model.platform,
            "inputs": [s.metadata().model_dump() for s in model.inputs],
            "outputs": [s.metadata().model_dump() for s in model.outputs],
            "parameters": {
                "registry_model": loaded.entry.registry_model,
                "follows": loaded.entry.follows,
                **model.parameters(),
            },
        }

    def ready(self, name: str, version: str | None) -> bool:
        if name == RECOMMEND_MODEL:
            name = self.config.recommend_model
        try:
            self.repository.get(name, version)
            return True
        except ProtocolError as error:
            if error.status == 404:
                raise
            return False


RECOMMEND_INPUTS = [TensorSpec("user_id", "INT64", (-1,)), TensorSpec("k", "INT32", (1,), optional=True)]
RECOMMEND_OUTPUTS = [
    TensorSpec("item_ids", "INT64", (-1, -1)),
    TensorSpec("scores", "FP32", (-1, -1)),
    TensorSpec("model_version", "BYTES", (-1,)),
]
