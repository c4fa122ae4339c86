"""Calls to backends for one Exchange, over the gateway's pool of keep-alive connections
(serving/gateway/http1.py: a tenth of aiohttp's client CPU per request): the best backend first,
then others on a failure before the first byte reached the client. A backend's 4xx is the
client's and never counts against it; 502s name the model, never a backend URL or its error text
(those go to the log)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass

from serving.gateway import fastjson
from serving.gateway.balancer import choose
from serving.gateway.errors import GatewayError
from serving.gateway.exchange import Exchange
from serving.gateway.http1 import Pool, UpstreamError

log = logging.getLogger("mlplane.gateway")
# what a backend connection can raise while a request or a stream is under way
UPSTREAM_ERRORS = (UpstreamError, asyncio.TimeoutError, ValueError, UnicodeDecodeError)
CLIENT_ERROR_TYPES = {"BadRequestError", "invalid_request_error"}  # OpenAI and vLLM error types of a bad request


class BackendFailure(Exception):
    """The backend failed before the first byte reached the client: another backend may be tried."""


@dataclass
class Answer:
    status: int
    content: bytes
    content_type: str
    payload: object = None


def session_for(settings) -> Pool:
    """The pooled client to every backend (created on the running loop, at start)."""
    return Pool(
        settings.connect_timeout_s, settings.request_timeout_s, first_byte_timeout_s=settings.first_byte_timeout_s
    )


def attempts(gateway, exchange: Exchange, group, region: str | None):
    """Backends to try in turn, each holding a slot in the exchange: the best one (503 when none is
    available), then others not tried yet, up to `max_attempts`."""
    settings = gateway.settings
    key_id = exchange.caller.key.key_id
    tried: set[str] = set()
    for _ in range(settings.max_attempts):
        state = choose(group.backends, region, tried, settings.spill_factor, key_id=key_id)
        if state is None:
            if not tried:
                raise unavailable_to(group, key_id, settings)
            return
        tried.add(state.spec.id)
        exchange.take(state)
        yield state


def unavailable_to(group, key_id: str, settings) -> GatewayError:
    """The 503 of a request no backend can take: none is available, or only this key's own circuits
    (its requests failed there in a row) hold it back."""
    retry = {"Retry-After": str(max(1, int(settings.circuit_open_s)))}
    if any(state.available() for state in group.backends):
        message = f"This key's recent requests to model '{group.name}' failed at every backend; retry later"
        return GatewayError(503, message, "service_unavailable", "key_circuit_open", headers=retry)
    message = f"No backend of model '{group.name}' is available; retry later"
    return GatewayError(503, message, "service_unavailable", "no_backend_available", headers=retry)


def blames_request(content: bytes, body: dict | None) -> bool:
    """Whether a backend's 5xx answer says the request was at fault, so that it counts against no backend
    and goes to no other: an OpenAI-shaped error of a 4xx kind (vLLM's BadRequestError), or a v2
    `{"error": ...}` naming one of the request's inputs ("input 'x': cannot reshape ...")."""
    try:
        error = fastjson.loads_lenient(content)
    except ValueError:
        return False
    if isinstance(error, dict) and isinstance(error.get("error"), dict):  # OpenAI's shape
        error = error["error"]
    if not isinstance(error, dict):
        return False
    code, kind = error.get("code"), error.get("type")
    if kind in CLIENT_ERROR_TYPES or (type(code) is int and 400 <= code < 500):
        return True
    message = error.get("error")
    inputs = (body or {}).get("inputs")
    if not isinstance(message, str) or not isinstance(inputs, list):
        return False
    names = [i["name"] for i in inputs if isinstance(i, dict) and isinstance(i.get("name"), str)]
    return any(re.search(rf"\binput\s+['\"]?{re.escape(name)}['\"]?(\W|$)", message) for name in names)


def failed(gateway, exchange: Exchange, group, error: Exception) -> None:
    """Books a failed attempt before the first byte; a refused or dropped connection marks the backend
    down at once, a timeout does not (a busy backend answers probes late)."""
    state = exchange.state
    exchange.release(False)
    if isinstance(error, UpstreamError | asyncio.TimeoutError):
        state.healthy = isinstance(error, asyncio.TimeoutError)
    log.warning(
        "backend %s failed before the first byte (%s: %s); trying another", state.spec.url, type(error).__name__, error
    )
    gateway.metrics.retries.labels(group.name).inc()


def all_failed(group) -> GatewayError:
    return GatewayError(
        502, f"Every backend of model '{group.name}' failed; retry later", "upstream_error", "backend_failed"
    )


def encode(body: dict | None, state) -> bytes | None:
    """The body for one backend (OpenAI backends get their own model name). The body was parsed
    strictly, so this cannot fail on the client's values."""
    if body is None:
        return None
    if state.spec.kind == "openai":
        body = {**body, "model": state.spec.model}
    return fastjson.dumps(body)


async def forward(
    gateway,
    exchange: Exchange,
    group,
    method: str,
    path_of,
    body: dict | None,
    region: str | None,
    parse_json: bool = True,
) -> Answer:
    """A non-streaming call, moved to another backend on a connection error, a 5xx or (with
    `parse_json`) an unreadable answer."""
    for state in attempts(gateway, exchange, group, region):
        started = time.perf_counter()
        try:
            response = await gateway.session.request(method, state.spec.url, path_of(state), encode(body, state))
            content = await response.read()
            status = response.status
            if status >= 500 and blames_request(content, body):
                exchange.release(None)  # the backend is fine; the request was wrong
                status = 400
            elif status >= 500:
                raise BackendFailure(f"HTTP {status}: {content[:200]!r}")
            answer = Answer(status, content, response.headers.get("content-type", "application/json"))
            if parse_json:
                answer.payload = fastjson.loads_lenient(content)
        except (*UPSTREAM_ERRORS, BackendFailure) as error:
            failed(gateway, exchange, group, error)
            continue
        exchange.release(True, time.perf_counter() - started)  # no-op after a request-blamed 5xx
        return answer
    raise all_failed(group)


async def open_stream(gateway, exchange: Exchange, group, body: dict, region: str | None, path: str):
    """Opens a streamed call and reads its first line; failures up to then move to another backend.
    Returns (status, first line or the refusal's body, lines or None when the backend refused with a
    4xx); while streaming, the exchange holds the backend's slot and its response."""
    for state in attempts(gateway, exchange, group, region):
        started = time.perf_counter()
        response = None
        try:
            response = await gateway.session.request("POST", state.spec.url, path, encode(body, state))
            if response.status >= 400:
                content = await response.read()
                if response.status >= 500 and blames_request(content, body):
                    exchange.release(None)
                    return 400, content, None
                if response.status >= 500:
                    raise BackendFailure(f"HTTP {response.status}: {content[:200]!r}")
                exchange.release(True, time.perf_counter() - started)
                return response.status, content, None
            exchange.upstream = response
            lines = response.lines()
            first = await anext(lines)
            return response.status, first, lines
        except (*UPSTREAM_ERRORS, BackendFailure, StopAsyncIteration) as error:
            if response is not None:
                exchange.upstream = None
                response.close()
            failed(gateway, exchange, group, error)
    raise all_failed(group)
