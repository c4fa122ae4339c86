"""OpenAI-compatible routes: chat and text completions (streamed or not), embeddings and the models a
key may use. Each request is one Exchange: validated, counted, reserved in full (every prompt, every
choice), forwarded, settled and recorded."""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from serving.gateway.errors import from_validation, read_json
from serving.gateway.exchange import CLIENT_GONE, Exchange
from serving.gateway.fastjson import FastJSONResponse
from serving.gateway.images import admit_images, has_images
from serving.gateway.routes.deps import CallerDep, gateway_in, region_of
from serving.gateway.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    ErrorResponse,
    ModelList,
)
from serving.gateway.service import Caller, Gateway, ModelGroup
from serving.gateway.sse import StreamTally, error_event, relay
from serving.gateway.upstream import UPSTREAM_ERRORS, forward, open_stream

log = logging.getLogger("mlplane.gateway")
router = APIRouter(tags=["openai"])
ENDPOINTS: dict[str, tuple[str, type[BaseModel]]] = {
    "chat": ("/v1/chat/completions", ChatCompletionRequest),
    "completions": ("/v1/completions", CompletionRequest),
    "embeddings": ("/v1/embeddings", EmbeddingRequest),
}
PATHS = {path: endpoint for endpoint, (path, _) in ENDPOINTS.items()}  # GatewayApp's direct path
OFF_LOOP_BYTES = 16_384  # bodies larger than this are tokenized in a thread, not on the event loop
ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 413, 422, 429, 502, 503)}
SSE_EVENT = {
    "type": "object",
    "properties": {
        "data": {"type": "string", "description": "A chunk as JSON (or an error object); the last is [DONE]"},
        "event": {"type": "string"},
        "id": {"type": "string"},
    },
    "required": ["data"],
}
# with `stream: true` the 200 is server-sent events (the schema is one event's)
STREAMED = {
    200: {"content": {"text/event-stream": {"schema": SSE_EVENT}}, "description": "JSON, or events if streamed"}
}


def body_doc(model: type[BaseModel]) -> dict:
    """The request body in the OpenAPI document (the handlers read it themselves, strictly)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def completion_cap(group: ModelGroup, endpoint: str, spec, body: dict) -> int:
    """Completion tokens to reserve: every choice of every prompt times the larger cap the request
    names. The cap the backend honours (vLLM: max_completion_tokens before max_tokens for chat,
    max_tokens alone for completions) is set to the model's default when the request names none."""
    if endpoint == "embeddings":
        return 0
    honoured = spec.max_completion_tokens if endpoint == "chat" and spec.max_completion_tokens else spec.max_tokens
    if honoured is None:
        body["max_tokens"] = group.max_tokens
    cap = max(honoured or group.max_tokens, spec.max_tokens or 0, spec.max_completion_tokens or 0)
    choices = spec.n or 1
    if endpoint == "completions":
        choices = max(choices, spec.best_of or 1) * prompt_count(spec.prompt)
    return choices * cap


def prompt_count(prompt) -> int:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


async def prompt_tokens(group: ModelGroup, endpoint: str, body: dict, size: int) -> int:
    if size > OFF_LOOP_BYTES:  # a large prompt must not stall every other request
        return await asyncio.to_thread(group.counter.prompt_tokens, endpoint, body)
    return group.counter.prompt_tokens(endpoint, body)


async def generate(request: Request, gateway: Gateway, who: Caller, endpoint: str) -> Response:
    path, schema = ENDPOINTS[endpoint]
    settings = gateway.settings
    async with Exchange(gateway, who, endpoint, "unknown") as exchange:
        body, size = await read_json(request, settings.max_body_bytes, settings.max_json_depth)
        if isinstance(body.get("model"), str) and body["model"] in gateway.router.groups:
            exchange.model = body["model"]
        try:
            spec = schema.model_validate(body)
        except ValidationError as error:
            raise from_validation(error) from None
        group = gateway.group_for(who, spec.model, "openai")
        prompt = await prompt_tokens(group, endpoint, body, size)
        if endpoint == "chat" and has_images(body):
            group, image_tokens = await admit_images(group, body, settings, off_loop=size > OFF_LOOP_BYTES)
            prompt += image_tokens
        await exchange.admit(prompt + completion_cap(group, endpoint, spec, body))
        region = region_of(request)
        if endpoint != "embeddings" and spec.stream:
            return await stream(gateway, exchange, group, body, spec, region, path, prompt)
        answer = await forward(gateway, exchange, group, "POST", lambda _s: path, body, region)
        payload = answer.payload
        ok = answer.status < 400 and isinstance(payload, dict)
        usage = (payload.get("usage") if ok else None) or {}
        used_prompt = _int(usage.get("prompt_tokens"), prompt) if ok else 0
        used_completion = _int(usage.get("completion_tokens"), 0) if ok else 0
        if isinstance(payload, dict) and "model" in payload:
            payload["model"] = group.name
        await exchange.finish(answer.status, used_prompt, used_completion)
        return FastJSONResponse(payload, status_code=answer.status)


def _int(value, default: int) -> int:
    return value if isinstance(value, int) and value >= 0 else default


class StreamingExchange(StreamingResponse):
    """A stream that closes its Exchange however it ends, even when the client is gone before the first
    byte and the body is never iterated."""

    def __init__(self, exchange: Exchange, events):
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": exchange.request_id},
        )
        self.exchange = exchange
        exchange.streaming = True

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await self.exchange.finish(CLIENT_GONE)  # does nothing when the stream finished it


async def stream(
    gateway: Gateway, exchange: Exchange, group: ModelGroup, body: dict, spec, region, path: str, prompt: int
) -> Response:
    pass_usage = bool(spec.stream_options and spec.stream_options.include_usage)
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    opened = time.perf_counter()
    status, first, lines = await open_stream(gateway, exchange, group, body, region, path)
    if lines is None:  # the backend refused the request (4xx): pass its answer on
        await exchange.finish(status)
        return Response(first, status_code=status, media_type="application/json")
    ttft = time.perf_counter() - opened
    gateway.metrics.child(gateway.metrics.ttft, group.name).observe(ttft)
    tally = StreamTally(prompt)
    return StreamingExchange(
        exchange, events(exchange, relay(first, lines, tally, group.name, pass_usage), tally, opened, ttft)
    )


async def events(exchange: Exchange, chunks, tally: StreamTally, opened: float, ttft: float):
    ok, status = None, CLIENT_GONE  # unless the stream ends or the backend fails, the client went away
    try:
        async for chunk in chunks:
            yield chunk
        ok, status = True, 200
    except UPSTREAM_ERRORS as error:  # after the first byte: never retried, the client is told
        ok, status = False, 502
        log.warning(
            "backend %s failed during a stream: %s: %s",
            exchange.state.spec.url if exchange.state else "?",
            type(error).__name__,
            error,
        )
        yield error_event(f"The backend failed during the stream ({type(error).__name__})")
    finally:
        exchange.release(ok, time.perf_counter() - opened if ok else None, ttft if ok else None)
        await exchange.finish(status, tally.prompt_tokens, tally.completion)


@router.post(
    "/v1/chat/completions",
    summary="Chat completion (server-sent events when stream is true)",
    openapi_extra=body_doc(ChatCompletionRequest),
    response_model=ChatCompletion,
    responses={**ERRORS, **STREAMED},
)
async def chat_completions(request: Request, who: CallerDep):
    return await generate(request, gateway_in(request), who, "chat")


@router.post(
    "/v1/completions",
    summary="Text completion",
    openapi_extra=body_doc(CompletionRequest),
    response_model=Completion,
    responses={**ERRORS, **STREAMED},
)
async def completions(request: Request, who: CallerDep):
    return await generate(request, gateway_in(request), who, "completions")


@router.post(
    "/v1/embeddings",
    summary="Embeddings",
    openapi_extra=body_doc(EmbeddingRequest),
    response_model=EmbeddingList,
    responses=ERRORS,
)
async def embeddings(request: Request, who: CallerDep):
    return await generate(request, gateway_in(request), who, "embeddings")


@router.get("/v1/models", summary="Models this key may use", response_model=ModelList, responses=ERRORS)
async def models(request: Request, who: CallerDep):
    gateway = gateway_in(request)
    data = [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "mlplane",
            "regions": sorted({s.spec.region for s in g.backends}),
        }
        for name, g in sorted(gateway.router.groups.items())
        if g.kind == "openai" and who.key.allows(name)
    ]
    return JSONResponse({"object": "list", "data": data})
