"""OpenAI's chat completions over the server's vision-language models (kind `vision_llm`), so that the
gateway's `vision: true` backends (kind openai) can point at this server as they would at vLLM:
`POST /v1/chat/completions` (streamed or not), `GET /v1/models` and `GET /health`, vLLM's probe path
that the gateway polls.

A request is one user message with one `image_url` part (a base64 data URL) and optional text parts,
the question (default: the one the model was trained on). The model answers single questions about
single images, so anything else (more messages, more images, n > 1) is a 400 naming it, never a
prompt silently cut. Errors are in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from typing import Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from serving.models.kinds.captioner import MAX_NEW_TOKENS
from serving.models.protocols.protocol import ErrorResponse, ProtocolError

CHAT_KIND = "vision_llm"
TAGS = ["openai"]


class ImageUrl(BaseModel):
    url: str


class ContentPart(BaseModel):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageUrl | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    include_usage: bool | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields a captioner has no use for

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2, description="0 or absent: greedy")
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None


class ChatError(ProtocolError):
    """A ProtocolError that names the request field at fault (OpenAI's `param`)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(status, message)
        self.param = param


def _chat_states(server) -> dict:
    """name -> repository state of the server's chat models."""
    return {name: state for name, state in server.repository.states.items() if state.entry.kind == CHAT_KIND}


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    error: OpenAIError


class WaitingResponse(BaseModel):
    waiting: dict[str, str]


def add_openai_routes(app: FastAPI, server) -> None:
    @app.post(
        "/v1/chat/completions",
        tags=TAGS,
        summary="A question about one image (OpenAI chat shape; server-sent events when stream is true)",
        responses={
            200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
            **{status: {"model": OpenAIErrorResponse} for status in (400, 404, 409, 413, 503)},
            **{status: {"model": ErrorResponse} for status in (401, 403)},  # the server's key check answers these
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatRequest"}}},
            }
        },
    )
    async def chat_completions(request: Request):
        try:
            body = await run_in_threadpool(_parse, await request.body())  # a large body is parsed off the loop
            return await _answer(server, body)
        except ProtocolError as error:
            return _error(error.status, error.message, getattr(error, "param", None))

    @app.get("/v1/models", tags=TAGS, summary="The chat models this server serves")
    async def models():
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "mlplane"}
            for name in sorted(_chat_states(server))
        ]
        return {"object": "list", "data": data}

    @app.get(
        "/health",
        tags=TAGS,
        summary="200 when every chat model serves a version (vLLM's probe path)",
        response_class=Response,
        responses={
            200: {"description": "Every chat model serves a version (no body, as vLLM answers)", "content": {}},
            503: {"model": WaitingResponse, "description": "The chat models still loading, and why"},
        },
    )
    async def health():
        waiting = {
            name: state.reason or "not loaded"
            for name, state in _chat_states(server).items()
            if state.current is None and not state.unloaded
        }
        return JSONResponse({"waiting": waiting}, status_code=503) if waiting else Response(status_code=200)


def _parse(raw: bytes) -> ChatRequest:
    try:
        return ChatRequest.model_validate_json(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ChatError(400, f"{where or 'body'}: {first.get('msg')}", where or None) from None


async def _answer(server, body: ChatRequest) -> Response:
    name = body.model
    chat_models = _chat_states(server)
    if name not in chat_models:
        raise ChatError(404, f"no chat model {name!r}; chat models: {sorted(chat_models)}", "model")
    if body.n != 1:
        raise ChatError(400, "n must be 1: the model gives one answer per request", "n")
    image, question = await run_in_threadpool(_question, body.messages)  # base64 of a large image
    inputs = {"image": np.array([image], dtype=object)}
    if question:
        inputs["prompt"] = np.array([question.encode()], dtype=object)
    parameters = {"temperature": body.temperature or 0.0, "top_p": body.top_p or 1.0}
    tokens = body.max_completion_tokens or body.max_tokens
    if tokens is not None:
        if tokens > MAX_NEW_TOKENS:
            field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            raise ChatError(400, f"{field} must be at most {MAX_NEW_TOKENS} (the model's context is short)", field)
        parameters["max_new_tokens"] = tokens
    _, version, outputs = await server.infer(name, None, inputs, parameters, "openai")
    text = outputs["text"][0].decode()
    finish = outputs["finish_reason"][0].decode()
    usage = {
        "prompt_tokens": int(outputs["prompt_tokens"][0]),
        "completion_tokens": int(outputs["completion_tokens"][0]),
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": name}
    if body.stream:
        with_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _events(head, text, finish, usage if with_usage else None), media_type="text/event-stream"
        )
    return JSONResponse(
        {
            **head,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": usage,
        },
        headers={"X-Model-Version": version},
    )


def _question(messages: list[ChatMessage]) -> tuple[bytes, str]:
    """(the image's bytes, the question) of a request's one user message."""
    if len(messages) != 1 or messages[0].role != "user":
        roles = [m.role for m in messages]
        raise ChatError(400, f"the model answers one user message (with one image); got roles {roles}", "messages")
    content = messages[0].content
    parts = content if isinstance(content, list) else []
    images = [p for p in parts if p.type == "image_url"]
    if len(images) != 1 or images[0].image_url is None:
        raise ChatError(400, f"the message needs exactly one image_url part, got {len(images)}", "messages[0].content")
    texts = [p.text for p in parts if p.type == "text" and p.text]
    return _data_url_bytes(images[0].image_url.url), " ".join(texts).strip()


def _data_url_bytes(url: str) -> bytes:
    header, sep, data = url.partition(",")
    if not (url.startswith("data:image/") and sep and header.endswith(";base64")):
        raise ChatError(400, "image_url must be a base64 data URL (data:image/...;base64,...)", "image_url.url")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ChatError(400, "image_url holds invalid base64", "image_url.url") from None


async def _events(head: dict, text: str, finish: str, usage: dict | None):
    """The answer as OpenAI's chunks: the role, the text, the finish reason, the usage when asked for.
    The answer is generated whole first (a caption is a few tokens), then sent."""
    chunk = {**head, "object": "chat.completion.chunk"}
    deltas = ({"role": "assistant", "content": ""}, {"content": text})
    for delta in deltas:
        yield _sse({**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    yield _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage is not None:
        yield _sse({**chunk, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


def _sse(event: dict) -> str:
    return "data: " + json.dumps(event, separators=(",", ":")) + "\n\n"


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "service_unavailable"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)
