"""Feast's feature-server API on the model server: `POST /get-online-features` with the request and
response shapes of `feast serve` (Feast's own request model and response conversion), answered from
the same online store the models read, so Feast's clients work against this server."""

from __future__ import annotations

import threading
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from serving.models.protocol import ErrorResponse, ProtocolError

FEAST = "feast feature server"
# Feast's SDK read is not safe from several threads at once here (500s at 32 connections in
# benchmarks/online_features.py): one read at a time
SDK_LOCK = threading.Lock()


class GetOnlineFeaturesRequest(BaseModel):
    """As `feast serve` takes it: a feature service or `view:feature` references, entity columns."""

    entities: dict[str, list[Any]]
    feature_service: str | None = None
    features: list[str] = []
    full_feature_names: bool = False


def add_feast_routes(app: FastAPI, server) -> None:
    @app.post(
        "/get-online-features",
        tags=[FEAST],
        responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
        summary="Online feature values (Feast feature-server shapes)",
    )
    async def get_online_features(body: GetOnlineFeaturesRequest):
        return JSONResponse(await run_in_threadpool(online_features, server, body))


def online_features(server, body: GetOnlineFeaturesRequest) -> dict:
    from feast.errors import FeastError
    from feast.feature_server_utils import convert_response_to_dict

    check_entities(body.entities)
    store = server.feature_store.store
    try:
        with SDK_LOCK:
            features = (
                store.get_feature_service(body.feature_service, allow_cache=True)
                if body.feature_service
                else body.features
            )
    except FeastError as error:
        raise ProtocolError(404, f"unknown feature service {body.feature_service!r}") from error
    if not body.feature_service and not body.features:
        raise ProtocolError(400, "give a feature_service or a list of features ('view:feature')")
    started = time.perf_counter()
    try:
        with SDK_LOCK:
            response = store.get_online_features(
                features=features, entity_rows=body.entities, full_feature_names=body.full_feature_names
            )
    except (FeastError, KeyError, ValueError, TypeError) as error:
        raise ProtocolError(400, f"{type(error).__name__}: {error}") from error
    server.metrics.feature_read.labels(body.feature_service or "features").observe(time.perf_counter() - started)
    return convert_response_to_dict(response.proto)


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
