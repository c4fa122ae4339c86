"""The gateway's HTTP service: the OpenAI, v2, admin and operations routers over one Gateway."""

from __future__ import annotations

import logging
import re
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic.json_schema import models_json_schema
from starlette.requests import ClientDisconnect, Request

from serving.api_docs import NO_CDN_PAGES, add_offline_docs
from serving.gateway.errors import GatewayError, error_handlers
from serving.gateway.routes import admin, openai, ops, v2
from serving.gateway.routes.deps import bearer_secret
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

    app = GatewayApp(
        title="mlplane ML gateway",
        version="2.0",
        lifespan=lifespan,
        description="One OpenAI-compatible API over model backends in several regions.",
        exception_handlers=error_handlers(),
        **NO_CDN_PAGES,
    )
    add_offline_docs(app)
    app.state.gateway = gateway
    for module in (openai, v2, admin, ops):
        app.include_router(module.router)
    app.openapi = lambda: openapi_document(app)
    return app


log = logging.getLogger("mlplane.gateway")
V2_INFER = re.compile(r"^/v2/models/([A-Za-z0-9._-]{1,200})/infer$")  # the route's own name constraint


class GatewayApp(FastAPI):
    """FastAPI with a direct path for the proxied POST routes: they go to their handlers without the
    middleware stack, route matching and dependency solving (about a third of the gateway's CPU per
    request), with the same authentication, handlers and error bodies. Everything else, and any request
    the direct path does not recognise exactly, takes FastAPI's path."""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or self.root_path or scope.get("root_path"):
            return await super().__call__(scope, receive, send)
        path = scope["path"]
        endpoint = openai.PATHS.get(path)
        name = None
        if endpoint is None:
            match = V2_INFER.match(path)
            if match is None:
                return await super().__call__(scope, receive, send)
            name = match.group(1)
        scope["app"] = self
        request = Request(scope, receive)
        gateway = self.state.gateway
        try:
            who = await gateway.authenticate(bearer_secret(request))
            if name is None:
                response = await openai.generate(request, gateway, who, endpoint)
            else:
                response = await v2.v2_call(request, gateway, who, name, "POST", "/infer")
        except GatewayError as error:
            response = error.response()
        except ClientDisconnect:  # the Exchange recorded it; nobody is left to answer
            return
        except Exception:  # the Exchange recorded a 500; FastAPI's path would answer the same status
            log.exception("request to %s failed inside the gateway", path)
            response = JSONResponse(
                GatewayError(500, "Internal gateway error", "internal_error").body(), status_code=500
            )
        await response(scope, receive, send)


def app_from_env() -> FastAPI:
    """The app of `$MLPLANE_GATEWAY_CONFIG`, for uvicorn's workers."""
    import os

    return create_app(os.environ["MLPLANE_GATEWAY_CONFIG"])


def openapi_document(app: FastAPI) -> dict:
    """FastAPI's document plus the request bodies the handlers read themselves (strictly, to answer
    malformed JSON in OpenAI's shape), with the served models' names as examples (made again when a
    reload changes them)."""
    groups = app.state.gateway.router.groups
    served = {kind: sorted(n for n, g in groups.items() if g.kind == kind) for kind in ("openai", "v2")}
    if app.openapi_schema is None or app.state.documented_models != served:
        app.openapi_schema = None
        app.state.documented_models = served
        document = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        _, definitions = models_json_schema(
            [(m, "validation") for m in OPENAPI_MODELS], ref_template="#/components/schemas/{model}"
        )
        components = document.setdefault("components", {})
        for name, schema in definitions.get("$defs", {}).items():
            components.setdefault("schemas", {}).setdefault(name, schema)
        components["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key (sk-mlp-...); the admin key for /admin and /metrics",
            }
        }
        for path, operations in document["paths"].items():
            if path != "/health":
                for operation in operations.values():
                    operation["security"] = [{"bearer": []}]
        name_models(document, served)
        app.openapi_schema = document
    return app.openapi_schema


def name_models(document: dict, served: dict[str, list[str]]) -> None:
    """The served models as examples of the request bodies' `model` and of v2 paths' `{name}`."""
    schemas = document["components"]["schemas"]
    for model in ("ChatCompletionRequest", "CompletionRequest", "EmbeddingRequest"):
        if served["openai"]:
            schemas[model]["properties"]["model"]["examples"] = served["openai"]
    for path, operations in document["paths"].items():
        for operation in operations.values() if path.startswith("/v2/models/") and served["v2"] else ():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "name":
                    parameter["schema"]["examples"] = served["v2"]
