"""The gateway's HTTP service: the OpenAI, v2, admin and operations routers over one Gateway."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from serving.gateway.errors import GatewayError, error_handlers
from serving.gateway.routes import admin, openai, ops, v2
from serving.gateway.schemas import OPENAPI_MODELS
from serving.gateway.service import Gateway

__all__ = ["GatewayError", "create_app"]


def create_app(config_path: str | Path) -> FastAPI:
    gateway = Gateway(config_path)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="mlplane ML gateway", version="2.0", lifespan=lifespan,
                  description="One OpenAI-compatible API over model backends in several regions.",
                  exception_handlers=error_handlers())
    app.state.gateway = gateway
    for module in (openai, v2, admin, ops):
        app.include_router(module.router)
    app.openapi = lambda: openapi_document(app)
    return app


def app_from_env() -> FastAPI:
    """The app of `$MLPLANE_GATEWAY_CONFIG`, for uvicorn's workers."""
    import os

    return create_app(os.environ["MLPLANE_GATEWAY_CONFIG"])


def openapi_document(app: FastAPI) -> dict:
    """FastAPI's document plus the request bodies the handlers read themselves (strictly, to answer
    malformed JSON in OpenAI's shape)."""
    if app.openapi_schema is None:
        document = get_openapi(title=app.title, version=app.version, description=app.description,
                               routes=app.routes)
        _, definitions = models_json_schema([(m, "validation") for m in OPENAPI_MODELS],
                                            ref_template="#/components/schemas/{model}")
        components = document.setdefault("components", {})
        for name, schema in definitions.get("$defs", {}).items():
            components.setdefault("schemas", {}).setdefault(name, schema)
        components["securitySchemes"] = {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "An API key (sk-mlp-...); the admin key for /admin and /metrics"}}
        for path, operations in document["paths"].items():
            if path != "/health":
                for operation in operations.values():
                    operation["security"] = [{"bearer": []}]
        app.openapi_schema = document
    return app.openapi_schema
