"""Feast's feature-server API on the model server: `POST /get-online-features` with the request and
response shapes of `feast serve`, answered from the same online store the models read, so Feast's
clients work against this server.

A request is answered through mlplane's read path (engines.features.feature_store.OnlineReader: one read of
the online store per view, lock-free: each thread reads through its own store instance; stored
values turned into JSON values once, `NativeValues`), and the JSON is built as Feast 0.67 builds it
(`OnlineStore.get_online_features`, `utils._populate_response_from_feature_data`, then
`feature_server_utils.convert_response_to_dict`, whose value and timestamp conversions it calls):

- columns: the request's entity columns that are join keys of any registered entity, in request
  order, each PRESENT with the epoch as its timestamps; then, per feature view in Feast's order, its
  features (`view__feature` with full_feature_names). The views and the order of a view's features
  are what Feast's own resolution (`utils._get_online_request_context`) gives in this process; Feast
  keeps a view's features in a set, so their order varies from one process to another, `feast serve`
  included (its clients match values by name).
- statuses: PRESENT where the store returned the feature for the entity (a stored null included),
  NOT_FOUND elsewhere. Feast 0.67's online read assigns neither OUTSIDE_MAX_AGE nor NULL_VALUE (only
  its precomputed-vector path applies a view's TTL): a value older than the view's TTL is PRESENT.
- event_timestamps: the entity's row timestamp in the view ("1970-01-01T00:00:00Z" where none).

The request's shape (feature service or feature list, full_feature_names) is resolved once by
Feast's own code, so unknown services, views, features and name collisions fail as in Feast, and
the plan is cached until the registry changes (checked at most every REGISTRY_CHECK_S, which also
lets the registry's cache refresh as an SDK call would).

Feast's SDK still answers, one request at a time (SDK_LOCK), what the fast path cannot answer
identically (`Plan.columns` returns None): on-demand views, request data, entityless views,
precomputed feature services, aliased join keys or versioned views, feature-view version metadata,
entity names instead of join keys, entity values whose type Feast would coerce (a string for an
integer key, a mixed column), no rows, and a view none of whose join keys is given (Feast's error).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from engines.features.feast_internals import online_request_context, timestamp_to_str, value_to_native
from engines.features.feature_store import OnlineReader
from serving.models.protocols.protocol import ErrorResponse, ProtocolError

FEAST = "feast feature server"
# Feast's SDK read is not safe from several threads at once here (500s at 32 connections in
# benchmarks/online_features.py): the SDK answers, and resolves plans, one at a time
SDK_LOCK = threading.Lock()
REGISTRY_CHECK_S = 1.0  # `feast serve` refreshes its registry every 5 s
INLINE_ROWS = 8  # requests of up to this many rows are answered on the event loop
MAX_PLANS = 1024  # request shapes cached; clients choose feature lists, so the cache is bounded
MAX_VALUES = 200_000  # distinct stored values remembered with their JSON value (NativeValues)
EPOCH = "1970-01-01T00:00:00Z"  # Feast's timestamp where there is none
INT64 = range(-(2**63), 2**63)


class GetOnlineFeaturesRequest(BaseModel):
    """As `feast serve` takes it: a feature service or `view:feature` references, entity columns."""

    entities: dict[str, list[Any]] = Field(min_length=1, description="Join key -> values (one or more keys)")
    feature_service: str | None = None
    features: list[str] = []
    full_feature_names: bool = False
    include_feature_view_version_metadata: bool = False


def add_feast_routes(app: FastAPI, server) -> None:
    features = app.state.feast_features = FeastFeatures(server)

    @app.post(
        "/get-online-features",
        tags=[FEAST],
        responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
        summary="Online feature values (Feast feature-server shapes)",
    )
    async def get_online_features(body: GetOnlineFeaturesRequest):
        ready = features.ready(body)
        if ready is not None:  # a few rows of a known shape: on the event loop, no thread hop
            return FeaturesJSON(features.fast(body, *ready))
        return FeaturesJSON(await run_in_threadpool(features.answer, body))


class FeaturesJSON(Response):
    """JSON by orjson: a 100-entity answer (250 kB) encodes in 0.2 ms against json.dumps' 2.5 ms."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class FeastFeatures:
    """Answers `get-online-features` for one server: plans per request shape, the fast path, the SDK."""

    def __init__(self, server):
        self.server = server
        self.plans: dict[tuple, Plan] = {}
        self.registry_stamp: datetime | None = None
        self.checked_at = float("-inf")
        self._check = threading.Lock()

    def answer(self, body: GetOnlineFeaturesRequest) -> dict:
        check_entities(body.entities)
        if not body.feature_service and not body.features:
            raise ProtocolError(400, "give a feature_service or a list of features ('view:feature')")
        plan = self.plan(body)
        columns = None if body.include_feature_view_version_metadata else plan.columns(body.entities)
        if columns is not None:
            return self.fast(body, plan, columns)
        started = time.perf_counter()
        response = self.sdk_answer(plan, body)
        self.server.metrics.feature_read.labels(body.feature_service or "features").observe(
            time.perf_counter() - started
        )
        return response

    def ready(self, body: GetOnlineFeaturesRequest) -> tuple[Plan, dict[str, list]] | None:
        """(plan, columns) for a request the fast path answers in well under a millisecond, without
        waiting on anything: a cached shape, at most INLINE_ROWS rows, no registry check due."""
        if time.monotonic() >= self.checked_at + REGISTRY_CHECK_S or body.include_feature_view_version_metadata:
            return None
        plan = self.plans.get(shape_of(body))
        entities = body.entities
        if plan is None or not entities or len(next(iter(entities.values()))) > INLINE_ROWS:
            return None
        check_entities(entities)
        columns = plan.columns(entities)
        return None if columns is None else (plan, columns)

    def fast(self, body: GetOnlineFeaturesRequest, plan: Plan, columns: dict[str, list]) -> dict:
        started = time.perf_counter()
        response = plan.answer(columns)
        self.server.metrics.feature_read.labels(body.feature_service or "features").observe(
            time.perf_counter() - started
        )
        return response

    def plan(self, body: GetOnlineFeaturesRequest) -> Plan:
        self.follow_registry()
        shape = shape_of(body)
        plan = self.plans.get(shape)
        if plan is None:
            with SDK_LOCK:
                plan = resolve(self.server.feature_store.store, body)
                if len(self.plans) >= MAX_PLANS:
                    self.plans.clear()
                self.plans[shape] = plan
        return plan

    def follow_registry(self) -> None:
        """Forget the plans when the registry changed. Touching the registry through the SDK lets it
        refresh its cache (the file changed, or its cache TTL ran out), as any SDK read would."""
        now = time.monotonic()
        if now < self.checked_at + REGISTRY_CHECK_S or not self._check.acquire(blocking=False):
            return
        try:
            self.checked_at = now
            store = self.server.feature_store.store
            with SDK_LOCK:
                try:
                    store.registry.list_entities(store.project, allow_cache=True)
                except Exception:  # unreadable now: the plans stay, a new shape's resolution says why
                    return
                stamp = getattr(store.registry, "cached_registry_proto_created", None)
                if stamp != self.registry_stamp:
                    self.plans.clear()
                    self.registry_stamp = stamp
        finally:
            self._check.release()

    def sdk_answer(self, plan: Plan, body: GetOnlineFeaturesRequest) -> dict:
        from feast.errors import FeastError
        from feast.feature_server_utils import convert_response_to_dict

        try:
            with SDK_LOCK:
                response = self.server.feature_store.store.get_online_features(
                    features=plan.features,
                    entity_rows=body.entities,
                    full_feature_names=body.full_feature_names,
                    include_feature_view_version_metadata=body.include_feature_view_version_metadata,
                )
        except (FeastError, KeyError, ValueError, TypeError) as error:
            raise ProtocolError(400, f"{type(error).__name__}: {error}") from error
        return convert_response_to_dict(response.proto)


def shape_of(body: GetOnlineFeaturesRequest) -> tuple:
    return (body.feature_service, () if body.feature_service else tuple(body.features), body.full_feature_names)


def resolve(store, body: GetOnlineFeaturesRequest) -> Plan:
    """The request's features as Feast resolves them (its errors become 404 or 400)."""
    from feast.errors import FeastError

    features: Any = body.features
    if body.feature_service:
        try:
            features = store.get_feature_service(body.feature_service, allow_cache=True)
        except FeastError as error:
            raise ProtocolError(404, f"unknown feature service {body.feature_service!r}") from error
    try:
        context = online_request_context(store, features, body.full_feature_names)
    except (FeastError, KeyError, ValueError, TypeError) as error:
        raise ProtocolError(400, f"{type(error).__name__}: {error}") from error
    return Plan.build(store, features, context, body.full_feature_names)


@dataclass
class Plan:
    """One request shape, resolved: what to read, the names to answer with; reader None: SDK only."""

    features: Any  # the FeatureService or the list of references, for the SDK
    reader: OnlineReader | None = None  # its plan: (view, features, [(join key, ValueType)]) in Feast's order
    names: list[list[str]] | None = None  # per view, its features' names in the answer
    join_keys: dict[str, Any] | None = None  # every registered join key -> its ValueType here (None: untyped)
    entity_names: frozenset[str] = frozenset()  # entity names that are not join keys (Feast maps them)

    @classmethod
    def build(cls, store, features, context, full_feature_names: bool) -> Plan:
        from feast.feature_view import FeatureView
        from feast.value_type import ValueType

        _, odfvs, name_to_key, types, join_keys, grouped, _, request_data, entityless = context
        precomputed = getattr(features, "precompute_online", False)
        versioned = store.config.registry.enable_online_feature_view_versioning
        if odfvs or request_data or entityless or precomputed or versioned:
            return cls(features)
        views = []
        for view, names in grouped:
            projection = view.projection
            if not isinstance(view, FeatureView) or projection.join_key_map or projection.version_tag is not None:
                return cls(features)
            keys = [(name_to_key[e], types.get(name_to_key[e])) for e in view.entities]
            if any(t not in (ValueType.INT64, ValueType.STRING) for _, t in keys):
                return cls(features)
            views.append((view, list(names), keys))
        return cls(
            features,
            OnlineReader(store, plan=views),
            [[f"{v.projection.name_to_use()}__{f}" if full_feature_names else f for f in fs] for v, fs, _ in views],
            {k: types.get(k) for k in join_keys},
            frozenset(n for n, k in name_to_key.items() if n != k),
        )

    def columns(self, entities: dict[str, list]) -> dict[str, list] | None:
        """The request's join-key columns as Feast keeps them, or None where only the SDK answers alike."""
        if self.reader is None or not next(iter(entities.values())):
            return None
        columns = {}
        for key, values in entities.items():
            if key in self.join_keys:
                if not exact(values, self.join_keys[key]):
                    return None
                columns[key] = values
            elif key in self.entity_names or not exact(values, None):  # Feast converts the others, then skips them
                return None
        if any(not any(k in columns for k, _ in keys) for _, _, keys in self.reader.plan):
            return None
        return columns

    def answer(self, columns: dict[str, list]) -> dict:
        n = len(next(iter(columns.values())))
        names = list(columns)
        results = [
            {"values": list(v), "statuses": ["PRESENT"] * n, "event_timestamps": [EPOCH] * n} for v in columns.values()
        ]
        for (view, features, keys), view_names in zip(self.reader.plan, self.names):
            try:
                key_of, found = self.reader.read_view(view, features, keys, columns, decode=NATIVE)
            except Exception as error:  # the store's own errors (SQLite, Redis connection, ...)
                raise ProtocolError(
                    503, f"online feature store unavailable ({type(error).__name__}: {error})"
                ) from error
            rows = [found[key] for key in key_of]
            times = [stamp(ts) for ts, _ in rows]
            datas = [data or {} for _, data in rows]
            names += view_names
            results += [feature_result(feature, datas, times) for feature in features]
        return {"results": results, "metadata": {"feature_names": names}}


def feature_result(feature: str, datas: list[dict], times: list[str]) -> dict:
    """One feature's values and statuses over the rows read, as Feast fills them: PRESENT where the store
    returned the feature (its value, null included), NOT_FOUND with a null elsewhere."""
    found = [data.get(feature, ABSENT) for data in datas]
    return {
        "values": [None if v is ABSENT else v for v in found],
        "statuses": ["NOT_FOUND" if v is ABSENT else "PRESENT" for v in found],
        "event_timestamps": times,
    }


ABSENT = object()


class NativeValues:
    """A stored value (a serialized Feast Value proto) -> the JSON value `feast serve` answers with
    (convert_response_to_dict's `_value_to_native`), memoized: the bytes determine the value, and values
    repeat (counts, categories, one entity read again), so most reads skip parsing and conversion. The
    lists it returns are shared between answers: read, never changed."""

    def __init__(self, size: int):
        self.size = size
        self.values: dict[bytes, Any] = {}

    def __call__(self, raw: bytes) -> Any:
        try:
            return self.values[raw]
        except KeyError:
            pass
        from feast.protos.feast.types.Value_pb2 import Value

        if len(self.values) >= self.size:
            self.values.clear()
        value = self.values[raw] = value_to_native(Value.FromString(raw))
        return value


NATIVE = NativeValues(MAX_VALUES)


def exact(values: list, value_type) -> bool:
    """The values are what Feast would keep unchanged: integers (in int64) for an INT64 key, strings for
    a STRING key, either alone for an untyped column (Feast infers the type from the first value)."""
    from feast.value_type import ValueType

    ints = all(isinstance(v, int) and v in INT64 for v in values)
    strings = all(isinstance(v, str) for v in values)
    if value_type is None:
        return ints or strings
    return ints if value_type == ValueType.INT64 else strings


@lru_cache(maxsize=4096)  # a handful of distinct stamps: each materialization writes one
def stamp(ts: datetime | None) -> str:
    """A row's timestamp as Feast writes it (a protobuf Timestamp through convert_response_to_dict)."""
    if ts is None:
        return EPOCH
    from google.protobuf.timestamp_pb2 import Timestamp

    proto = Timestamp()
    proto.FromDatetime(ts)
    return timestamp_to_str(proto)


def check_entities(entities: dict[str, list]) -> None:
    if not entities:
        raise ProtocolError(400, "entities is empty: give at least one join key with its values")
    sizes = {len(v) for v in entities.values()}
    if len(sizes) != 1:
        raise ProtocolError(400, f"entity columns differ in length: {sorted(sizes)}")
    for key, values in entities.items():
        bad = next((v for v in values if not isinstance(v, int | str) or isinstance(v, bool)), None)
        if bad is not None:
            raise ProtocolError(400, f"entity {key!r}: values must be integers or strings, got {bad!r}")
