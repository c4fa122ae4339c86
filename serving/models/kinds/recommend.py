"""Real-time recommendations: the user's online features (the feature service the model version was
trained with, streaming views included) -> the user tower's vector -> candidates from the vector
database -> reranked by the exact model score, without what the user played in the last hour or the
caller excludes -> top k with the model version.

The request path stays open for experiments and logging: `choose_variant(user_id, context)` routes the
request to the served model that answers (default: the champion entry; serving/models/hooks/experiments.py
assigns variants), and every answer goes to each `on_answer` hook (the served-feature sampler,
prediction logs, shadows). `answer_with` computes an answer from features already read (shadows).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from engines.features.feature_store import FeatureStoreEngine, OnlineReader
from engines.models.batch_inference import VECTOR_NAME, collection_name, index_items
from engines.retrieval.vector_store import VectorStore
from feature_defs import catalogue
from feature_defs.compile.flink import empty_values
from feature_defs.compile.streaming import streaming_plans
from serving.models.kinds.towers import TwoTowerModel
from serving.models.metrics import ServerMetrics
from serving.models.protocols.protocol import INT64_MAX, INT64_MIN, ProtocolError
from serving.models.repository import LoadedVersion, ModelRepository

USER_KEY = "user_id"
RECENT_PLAYS = "user_activity_realtime__last_played_items_1h"  # the streaming view: not what was just played
MAX_K = 1000


@dataclass
class Answer:
    """One recommendation as served; what every hook sees."""

    request_id: str
    user_id: int
    k: int
    context: dict[str, Any]
    variant: str
    model_name: str
    model_version: str
    feature_service: str
    item_ids: list[int]
    scores: list[float]
    features: dict[str, Any]
    served_at: datetime
    timings_ms: dict[str, float] = field(default_factory=dict)
    served_model: str = ""  # the server's entry that computed it
    experiment: str = ""  # the experiment whose variant answered
    assignments: dict[str, str] = field(default_factory=dict)  # every experiment's variant for this user
    role: str = "live"  # or "shadow": computed beside a live answer, never served
    log_inputs: bool = False  # the model version's card lets its inputs be logged
    experiments_config: str = ""  # digest of the experiments file that routed it ("" without one)


@dataclass(frozen=True)
class Route:
    """Who answers a request: a served entry, and the experiment and variant that chose it."""

    model: str
    experiment: str = ""
    variant: str = ""
    assignments: dict[str, str] = field(default_factory=dict)
    config: str = ""  # digest of the experiments file that chose it


VariantChooser = Callable[[int, dict], Route]
AnswerHook = Callable[[Answer], None]


STREAMING_EMPTY = {
    f"{plan.view}__{feature}": value
    for plan in streaming_plans(catalogue)
    for feature, value in empty_values(plan).items()
    if value is not None
}


class UserFeatures:
    """Online reads of a feature service's user-keyed views (the (user, item) views need an item)."""

    def __init__(self, engine: FeatureStoreEngine):
        self.engine = engine
        self._readers: dict[str, OnlineReader] = {}
        self._lock = threading.Lock()

    def reader(self, service: str) -> OnlineReader:
        if service not in self._readers:
            with self._lock:
                if service in self._readers:  # another thread built it while this one waited
                    return self._readers[service]
                reader = OnlineReader(self.engine.store, service)
                reader.plan = [p for p in reader.plan if [k for k, _ in p[2]] == [USER_KEY]]
                reader.join_keys = [USER_KEY]
                self._readers[service] = reader
        return self._readers[service]

    def read(self, service: str, user_ids: list[int]) -> dict[str, list]:
        try:
            values = self.reader(service).read([{USER_KEY: u} for u in user_ids])
        except Exception as error:
            raise ProtocolError(503, f"online feature store unavailable ({type(error).__name__}: {error})") from error
        # a user the stream has no window for holds the empty window's values (0, []), as the training join
        # gives (engines.features.point_in_time), not a null the model never saw
        for column, empty in STREAMING_EMPTY.items():
            if column in values:
                values[column] = [empty if v is None else v for v in values[column]]
        return values


class Candidates:
    """The vector database behind retrieval; collections indexed per model version when it loads."""

    def __init__(self, store: VectorStore):
        self.store = store
        self._lock = threading.Lock()  # the embedded engine is one process's, not every thread's at once

    def index(self, served: TwoTowerModel, rows, version: str) -> None:
        with self._lock:
            index_items(self.store, served.model, rows, version)

    def search(self, version: str, user_vector: np.ndarray, n: int) -> list[int]:
        query = np.append(user_vector.astype(np.float32), 0.0)
        with self._lock:
            hits = self.store.search(collection_name(version), query, VECTOR_NAME, n)
        return [int(h.payload["item_id"]) for h in hits]


class Recommender:
    def __init__(
        self,
        repository: ModelRepository,
        features: UserFeatures,
        candidates: Candidates,
        metrics: ServerMetrics,
        default_variant: str,
        n_candidates: int,
        choose_variant: VariantChooser | None = None,
        on_answer: list[AnswerHook] | None = None,
    ):
        self.repository = repository
        self.features = features
        self.candidates = candidates
        self.metrics = metrics
        self.n_candidates = n_candidates
        self.choose_variant = choose_variant or (lambda user_id, context: Route(default_variant))
        self.on_answer = list(on_answer or [])

    def recommend(self, user_id: int, k: int, context: dict | None = None, request_id: str | None = None) -> Answer:
        check_request(user_id, k, context)
        context = context or {}
        started = time.perf_counter()
        route = self.choose_variant(user_id, context)
        loaded = self.repository.get(route.model)
        served = self._two_tower(route.model, loaded)
        features = self.features.read(served.feature_service, [user_id])
        read = time.perf_counter()
        self.metrics.feature_read.labels(served.feature_service).observe(read - started)
        answer = self.answer_with(
            loaded, route, user_id, k, context, {name: values[0] for name, values in features.items()}, request_id
        )
        answer.timings_ms = {
            "features": (read - started) * 1000,
            **answer.timings_ms,
            "total": (time.perf_counter() - started) * 1000,
        }
        for hook in self.on_answer:
            hook(answer)
        return answer

    def answer_with(
        self,
        loaded: LoadedVersion,
        route: Route,
        user_id: int,
        k: int,
        context: dict,
        features: dict[str, Any],
        request_id: str | None = None,
    ) -> Answer:
        """The answer of one loaded version to features already read (one row: column -> value)."""
        served = self._two_tower(route.model, loaded)
        started = time.perf_counter()
        vector = served.user_vectors({name: [value] for name, value in features.items()})[0]
        found = self.candidates.search(loaded.version, vector, max(self.n_candidates, k))
        retrieved = time.perf_counter()
        items, scores = self.rerank(served, vector, found, excluded({n: [v] for n, v in features.items()}, context), k)
        self.metrics.retrieval.labels(route.model, loaded.version).observe(retrieved - started)
        return Answer(
            request_id or uuid.uuid4().hex,
            user_id,
            k,
            context,
            route.variant or route.model,
            loaded.entry.registry_model,
            loaded.version,
            served.feature_service,
            items,
            scores,
            features,
            datetime.now(UTC),
            {"retrieval": (retrieved - started) * 1000},
            route.model,
            route.experiment,
            dict(route.assignments),
            log_inputs=served.log_inputs,
            experiments_config=route.config,
        )

    @staticmethod
    def _two_tower(name: str, loaded: LoadedVersion) -> TwoTowerModel:
        if not isinstance(loaded.model, TwoTowerModel):
            raise ProtocolError(400, f"variant {name!r} is not a two-tower model")
        return loaded.model

    @staticmethod
    def rerank(
        served: TwoTowerModel, vector: np.ndarray, found: list[int], exclude: set[int], k: int
    ) -> tuple[list[int], list[float]]:
        """The candidates by the model's own score (inner product), best first, exclusions dropped; equal
        scores (items with the same features, common among new ones) by item id, so answers are stable."""
        if served.items is None:
            raise ProtocolError(503, "this version has no item catalogue to recommend from")
        keep = np.array([i for i in found if i not in exclude and i in served.items.row_of], dtype=np.int64)
        if not len(keep):
            return [], []
        scores = served.items.vectors[served.items.rows(keep)] @ vector
        order = np.lexsort((keep, -scores))[:k]
        return keep[order].tolist(), scores[order].astype(float).tolist()


def excluded(features: dict[str, list], context: dict) -> set[int]:
    played = features.get(RECENT_PLAYS, [None])[0] or []
    return {int(i) for i in played} | {int(i) for i in context.get("exclude_item_ids", [])}


def check_request(user_id: Any, k: Any, context: Any) -> None:
    if not is_int64(user_id):
        raise ProtocolError(400, f"user_id must be an integer within int64, got {user_id!r}")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise ProtocolError(400, f"k must be an integer from 1 to {MAX_K}, got {k!r}")
    if context is not None and not isinstance(context, dict):
        raise ProtocolError(400, f"context must be an object, got {type(context).__name__}")
    ids = (context or {}).get("exclude_item_ids", [])
    if not isinstance(ids, list) or not all(map(is_int64, ids)):
        raise ProtocolError(400, "context.exclude_item_ids must be a list of integers within int64")


def is_int64(value: Any) -> bool:
    """A JSON integer a lake column can hold: no boolean, no float, nothing past int64."""
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX
