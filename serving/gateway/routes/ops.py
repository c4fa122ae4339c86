"""Operations: liveness and Prometheus metrics. Metrics name backends and models, so they need the
admin key unless settings.public_metrics is true."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving.gateway.errors import GatewayError
from serving.gateway.routes.deps import bearer_secret, gateway_in, is_admin
from serving.gateway.schemas import ErrorResponse

router = APIRouter(tags=["ops"])


@router.get("/health", summary="Liveness")
async def health():
    return {"status": "ok"}


@router.get(
    "/metrics",
    summary="Prometheus metrics (the admin key, unless settings.public_metrics)",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {}}},
        401: {"model": ErrorResponse, "description": "Not the admin key (while metrics are not public)"},
    },
)
async def metrics(request: Request):
    gateway = gateway_in(request)
    if not gateway.settings.public_metrics and not is_admin(gateway, bearer_secret(request)):
        raise GatewayError(
            401,
            "/metrics needs the admin key (or settings.public_metrics: true)",
            "invalid_request_error",
            "invalid_api_key",
        )
    gateway.metrics.observe_backends({n: g.backends for n, g in gateway.router.groups.items()})
    return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)
