"""The REST front end: the Open Inference Protocol v2 (health, metadata, infer with JSON or binary
tensors, the model repository extension), `POST /recommend`, Feast's `POST /get-online-features`,
OpenAI's `POST /v1/chat/completions` for vision-language models and `GET /metrics`. Every client
error is a 4xx `{"error": "..."}` naming the problem (OpenAI's error shape on the OpenAI routes)."""

from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager
from typing import Annotated

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, Strict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from serving.api_docs import NO_CDN_PAGES, add_offline_docs
from serving.models.auth import Keys, rest_role
from serving.models.protocols import binary
from serving.models.protocols.openai_api import ChatRequest, add_openai_routes
from serving.models.protocols.protocol import (
    INT64_MAX,
    INT64_MIN,
    OFF_LOOP_BYTES,
    ErrorResponse,
    InferenceRequest,
    InferenceResponse,
    LiveResponse,
    ModelMetadataResponse,
    ProtocolError,
    ReadyResponse,
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryModel,
    ServerMetadataResponse,
    encode_output,
)
from serving.models.server import EXTENSIONS, SERVER_NAME, SERVER_VERSION, ModelServer

V2 = "open inference protocol v2"
ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 409, 413, 503)}
STRING = {"type": "string"}
OFF_LOOP_ELEMENTS = 16_384  # larger answers are encoded in a thread, as larger bodies are read (OFF_LOOP_BYTES)


Int64 = Annotated[int, Strict(), Field(ge=INT64_MIN, le=INT64_MAX)]  # a JSON integer: no boolean, float or string


class RecommendRequest(BaseModel):
    user_id: Int64
    k: Annotated[int, Strict()] = Field(default=10, ge=1, le=1000)
    context: dict = Field(default_factory=dict, description="Free-form; `exclude_item_ids` drops items")
    request_id: str | None = None


class RecommendResponse(BaseModel):
    request_id: str
    user_id: int
    items: list[int]
    scores: list[float]
    model_name: str
    model_version: str
    variant: str
    experiment: str = Field(default="", description='The experiment whose variant answered ("" for none)')
    timings_ms: dict[str, float]


def error_response(error: ProtocolError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse({"error": error.message}, status_code=error.status, headers=headers)


INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")  # the infer routes' paths


class ModelServerApp(FastAPI):
    """FastAPI with a direct path for `POST .../infer`: the same handler, without the middleware stack,
    route matching and parameter solving (a third of the server's CPU per inference). Everything else
    takes FastAPI's path; the routes stay declared there for the OpenAPI document."""

    infer_handler = None  # set by create_app
    keys = Keys()  # set by create_app; these refuse every control call
    max_body_bytes = 64 * 1024 * 1024  # set by create_app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            path = scope["path"].removeprefix(scope.get("root_path") or "")
            try:
                self.keys.check(rest_role(path), Headers(scope=scope).get("authorization"))
            except ProtocolError as error:
                return await error_response(error)(scope, receive, send)
            limited = self._limited(scope, receive)
            if limited is None:
                error = ProtocolError(413, f"request body over {self.max_body_bytes} bytes (max_body_bytes)")
                return await error_response(error)(scope, receive, send)
            receive = limited
        if scope["type"] == "http" and scope["method"] == "POST" and not self.root_path and not scope.get("root_path"):
            match = INFER_PATH.match(scope["path"])
            if match is not None:
                scope["app"] = self
                try:
                    response = await self.infer_handler(match.group(1), Request(scope, receive), match.group(2))
                except ProtocolError as error:
                    response = error_response(error)
                except ClientDisconnect:
                    return
                return await response(scope, receive, send)
        await super().__call__(scope, receive, send)

    def _limited(self, scope, receive):
        """None when the declared length is over the limit (refused unread); else a receive that stops a
        body without a declared length once it passes the limit."""
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        limit, seen = self.max_body_bytes, 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise ProtocolError(413, f"request body over {limit} bytes (max_body_bytes)")
            return message

        return limited


def create_app(
    server: ModelServer, start: bool = True, grpc_port: int | None = None, grpc_host: str = "127.0.0.1"
) -> FastAPI:
    """The REST app; its lifespan loads the models, follows the aliases and, with `grpc_port`, runs the
    gRPC front end beside it on the same server core."""
    from serving.models.protocols.feast_api import add_feast_routes

    app = ModelServerApp(
        title="mlplane model server",
        version=SERVER_VERSION,
        lifespan=_lifespan(server, start, grpc_port, grpc_host),
        description="Open Inference Protocol v2 over the platform's registry models, real-time "
        "recommendations and online features.",
        **NO_CDN_PAGES,
    )
    add_offline_docs(app)
    app.state.server = server
    app.infer_handler = _infer(server)
    app.keys = server.keys
    app.max_body_bytes = server.config.max_body_bytes

    _error_handlers(app)
    _health_routes(app, server)
    _model_routes(app, server)
    _repository_routes(app, server)
    _recommend_routes(app, server)
    _operations_routes(app, server)
    add_feast_routes(app, server)
    add_openai_routes(app, server)
    _document_request_bodies(app)
    return app


def _lifespan(server: ModelServer, start: bool, grpc_port: int | None, grpc_host: str):
    """Loads the models and follows the aliases (`start`), and runs the gRPC front end beside REST."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        grpc = None
        if start:
            server.start()
        if grpc_port:
            from serving.models.protocols.grpc_server import GrpcFrontEnd

            grpc = GrpcFrontEnd(server, grpc_host, grpc_port)
            await grpc.start()
        yield
        if grpc is not None:
            await grpc.stop()
        if start:
            server.close()

    return lifespan


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProtocolError)
    async def protocol_error(request: Request, error: ProtocolError):
        return error_response(error)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        """FastAPI's and Starlette's own refusals (unparsable body, no route, method) in the documented shape."""
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError):
        return JSONResponse({"error": _validation_message(error.errors())}, status_code=400)


def _recommend_routes(app: FastAPI, server: ModelServer) -> None:
    @app.post(
        "/recommend",
        response_model=RecommendResponse,
        responses=ERRORS,
        tags=["recommendations"],
        summary="Top k items for a user, with the model version",
        openapi_extra=_json_body(RecommendRequest),
    )
    async def recommend(request: Request):
        raw = await request.body()
        if len(raw) > OFF_LOOP_BYTES:  # a long exclusion list is parsed beside the loop, not on it
            body = await run_in_threadpool(read_recommend_body, raw)
        else:
            body = read_recommend_body(raw)
        answer = await server.recommend(body.user_id, body.k, body.context, body.request_id)
        return {
            "request_id": answer.request_id,
            "user_id": answer.user_id,
            "items": answer.item_ids,
            "scores": answer.scores,
            "model_name": answer.model_name,
            "model_version": answer.model_version,
            "variant": answer.variant,
            "experiment": answer.experiment,
            "timings_ms": answer.timings_ms,
        }


def _operations_routes(app: FastAPI, server: ModelServer) -> None:
    @app.get(
        "/v2/experiments",
        tags=["experiments"],
        summary="The A/B experiments and shadows in use, and why a changed file is not (reason)",
    )
    async def experiments():
        return server.experiments.describe()

    @app.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics",
        response_class=Response,
        responses={
            200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
        },
    )
    async def metrics():
        return Response(server.metrics.exposition(), media_type="text/plain; version=0.0.4")


def _health_routes(app: FastAPI, server: ModelServer) -> None:
    @app.get("/v2/health/live", response_model=LiveResponse, tags=[V2])
    async def live():
        return {"live": True}

    @app.get(
        "/v2/health/ready",
        response_model=ReadyResponse,
        responses={503: {"model": ReadyResponse, "description": "Not ready (yet)"}},
        tags=[V2],
        summary="Ready when every configured model serves a version",
    )
    async def ready():
        is_ready = all(s.current is not None for s in server.repository.states.values() if not s.unloaded)
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    @app.get("/v2", response_model=ServerMetadataResponse, tags=[V2])
    async def server_metadata():
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}


def _model_routes(app: FastAPI, server: ModelServer) -> None:
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.add_api_route(
            prefix,
            _metadata(server),
            methods=["GET"],
            response_model=ModelMetadataResponse,
            responses=ERRORS,
            tags=[V2],
            summary="Model metadata",
        )
        app.add_api_route(
            f"{prefix}/ready",
            _ready(server),
            methods=["GET"],
            response_model=ReadyResponse,
            responses={**ERRORS, 503: {"model": ReadyResponse, "description": "Not ready (yet)"}},
            tags=[V2],
            summary="Model readiness",
        )
        app.add_api_route(
            f"{prefix}/infer",
            _infer(server),
            methods=["POST"],
            response_model=InferenceResponse,
            responses=ERRORS,
            tags=[V2],
            summary="Inference (JSON or binary tensor data)",
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferenceRequest"}}},
                }
            },
        )


def _metadata(server: ModelServer):
    async def metadata(name: str, version: str | None = None):
        return server.metadata(name, version)

    return metadata


def _ready(server: ModelServer):
    async def ready(name: str, version: str | None = None):
        is_ready = server.ready(name, version)
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    return ready


def read_infer_body(raw: bytes, header_length: str | None) -> tuple[InferenceRequest, dict[str, np.ndarray]]:
    """The request and its input tensors (JSON and binary parts), checked."""
    header, tensors = binary.split_body(raw, header_length)
    try:
        body = InferenceRequest.model_validate_json(header)
    except ValidationError as error:
        raise ProtocolError(400, "invalid inference request: " + _validation_message(error.errors())) from error
    return body, binary.decode_inputs(body, tensors)


def read_recommend_body(raw: bytes) -> RecommendRequest:
    try:
        return RecommendRequest.model_validate_json(raw)
    except ValidationError as error:
        raise ProtocolError(400, _validation_message(error.errors())) from error


def _json_body(model: type[BaseModel]) -> dict:
    """The OpenAPI request body of a route that reads its body itself (documented by _document_request_bodies)."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _infer(server: ModelServer):
    async def infer(name: str, request: Request, version: str | None = None):
        server.check_model(name, version)  # an unknown model is refused before its body is read
        raw, header_length = await request.body(), request.headers.get(binary.HEADER)
        if len(raw) > OFF_LOOP_BYTES:
            body, inputs = await run_in_threadpool(read_infer_body, raw, header_length)
        else:
            body, inputs = read_infer_body(raw, header_length)
        parameters = body.parameters or {}
        model, served, outputs = await server.infer(name, version, inputs, parameters, "rest")
        if sum(np.size(v) for v in outputs.values()) > OFF_LOOP_ELEMENTS:
            return await run_in_threadpool(_infer_answer, body, model, served, outputs)
        return _infer_answer(body, model, served, outputs)

    return infer


def _infer_answer(body: InferenceRequest, name: str, served: str, outputs: dict[str, np.ndarray]) -> Response:
    """The answer in JSON, or with the binary outputs the request asks for."""
    parameters = body.parameters or {}
    requested = {o.name: o for o in body.outputs} if body.outputs else None
    if requested is not None:
        unknown = sorted(set(requested) - set(outputs))
        if unknown:
            raise ProtocolError(400, f"model {name!r} has no output(s) {unknown}; outputs: {sorted(outputs)}")
        outputs = {k: v for k, v in outputs.items() if k in requested}
    answer = {
        "model_name": name,
        "model_version": served,
        "id": body.id,
        "outputs": [encode_output(k, v) for k, v in outputs.items()],
    }
    as_binary = {
        k
        for k in outputs
        if (requested and (requested[k].parameters or {}).get("binary_data")) or parameters.get("binary_data_output")
    }
    if as_binary:
        payload, length = binary.encode_binary_response(answer, {k: outputs[k] for k in as_binary})
        return Response(
            payload, media_type="application/octet-stream", headers={"Inference-Header-Content-Length": str(length)}
        )
    return Response(json.dumps(answer, separators=(",", ":"), allow_nan=False), media_type="application/json")


def _repository_routes(app: FastAPI, server: ModelServer) -> None:
    @app.post(
        "/v2/repository/index",
        response_model=list[RepositoryModel],
        tags=[V2],
        responses=ERRORS,
        summary="Every configured model, its version and state",
    )
    async def index(body: RepositoryIndexRequest | None = None):
        return server.repository.index(ready_only=bool(body and body.ready))

    @app.post(
        "/v2/repository/models/{name}/load",
        tags=[V2],
        responses=ERRORS,
        response_model=RepositoryModel,
        summary="Load now (parameters: `version` or `alias` to follow); needs the admin key",
    )
    async def load(name: str, body: RepositoryLoadRequest | None = None):
        parameters = body.parameters.model_dump(exclude_none=True) if body and body.parameters else None
        return await run_in_threadpool(server.repository.load, name, parameters)

    @app.post(
        "/v2/repository/models/{name}/unload", tags=[V2], responses=ERRORS, summary="Stop serving; needs the admin key"
    )
    async def unload(name: str):
        await run_in_threadpool(server.repository.unload, name)  # it waits for a load in progress
        return {}


def _validation_message(errors: list) -> str:
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        parts.append(f"{where or 'body'}: {e.get('msg')}")
    return "; ".join(parts) or "invalid request"


def _document_request_bodies(app: FastAPI) -> None:
    """The infer and chat routes read their body themselves (JSON or binary); their schemas are added here."""

    def openapi():
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (InferenceRequest, ChatRequest, RecommendRequest):
                request_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(request_schema.pop("$defs", {}))
                components[model.__name__] = request_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
