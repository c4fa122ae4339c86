"""Calls to backends for one Exchange: the best backend first, then others on a failure before the
first byte reached the client. A backend's 4xx is the client's and never counts against it; 502s name
the model, never a backend URL or its error text (those go to the log)."""

from __future__ import annotations

import json
import logging
import time

import httpx

from serving.gateway.balancer import choose
from serving.gateway.errors import GatewayError
from serving.gateway.exchange import Exchange
from serving.gateway.service import Gateway, ModelGroup

log = logging.getLogger("mlplane.gateway")
JSON_HEADERS = {"content-type": "application/json"}


class BackendFailure(Exception):
    """The backend failed before the first byte reached the client: another backend may be tried."""


def attempts(gateway: Gateway, exchange: Exchange, group: ModelGroup, region: str | None):
    """Backends to try in turn, each holding a slot in the exchange: the best one (503 when none is
    available), then others not tried yet, up to `max_attempts`."""
    settings = gateway.settings
    tried: set[str] = set()
    for _ in range(settings.max_attempts):
        state = choose(group.backends, region, tried, settings.spill_factor)
        if state is None:
            if not tried:
                raise GatewayError(503, f"No backend of model '{group.name}' is available; retry later",
                                   "service_unavailable", "no_backend_available",
                                   headers={"Retry-After": str(max(1, int(settings.circuit_open_s)))})
            return
        tried.add(state.spec.id)
        exchange.take(state)
        yield state


def failed(gateway: Gateway, exchange: Exchange, group: ModelGroup, error: Exception) -> None:
    """Books a failed attempt before the first byte."""
    state = exchange.state
    exchange.release(False)
    if isinstance(error, httpx.TransportError):
        state.healthy = isinstance(error, httpx.TimeoutException)  # a refused connection marks it down now
    log.warning("backend %s failed before the first byte (%s: %s); trying another",
                state.spec.url, type(error).__name__, error)
    gateway.metrics.retries.labels(group.name).inc()


def all_failed(group: ModelGroup) -> GatewayError:
    return GatewayError(502, f"Every backend of model '{group.name}' failed; retry later", "upstream_error",
                        "backend_failed")


def encode(body: dict | None, state) -> bytes | None:
    """The body for one backend (OpenAI backends get their own model name). The body was parsed
    strictly, so this cannot fail on the client's values."""
    if body is None:
        return None
    if state.spec.kind == "openai":
        body = {**body, "model": state.spec.model}
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


async def forward(gateway: Gateway, exchange: Exchange, group: ModelGroup, method: str, path_of,
                  body: dict | None, region: str | None, parse_json: bool = True):
    """A non-streaming call, moved to another backend on a transport error, a 5xx or (with `parse_json`)
    an unreadable answer. Returns (response, payload)."""
    for state in attempts(gateway, exchange, group, region):
        started = time.perf_counter()
        try:
            response = await gateway.client.request(method, state.spec.url + path_of(state),
                                                    content=encode(body, state), headers=JSON_HEADERS)
            if response.status_code >= 500:
                raise BackendFailure(f"HTTP {response.status_code}: {response.text[:200]}")
            payload = response.json() if parse_json else None
        except (httpx.HTTPError, BackendFailure, ValueError) as error:
            failed(gateway, exchange, group, error)
            continue
        exchange.release(True, time.perf_counter() - started)
        return response, payload
    raise all_failed(group)


async def open_stream(gateway: Gateway, exchange: Exchange, group: ModelGroup, body: dict, region: str | None,
                      path: str):
    """Opens a streamed call and reads its first line; failures up to then move to another backend.
    Returns (status, first line or the refusal's body, lines or None when the backend refused with a 4xx);
    while streaming, the exchange holds the backend's slot and its response."""
    for state in attempts(gateway, exchange, group, region):
        started = time.perf_counter()
        response = None
        try:
            request = gateway.client.build_request("POST", state.spec.url + path, content=encode(body, state),
                                                   headers=JSON_HEADERS)
            response = await gateway.client.send(request, stream=True)
            if response.status_code >= 400:
                content = await response.aread()
                await response.aclose()
                if response.status_code >= 500:
                    raise BackendFailure(f"HTTP {response.status_code}: {content[:200]!r}")
                exchange.release(True, time.perf_counter() - started)
                return response.status_code, content, None
            exchange.upstream = response
            lines = response.aiter_lines()
            first = await anext(lines)
            return response.status_code, first, lines
        except (httpx.HTTPError, BackendFailure, StopAsyncIteration) as error:
            if response is not None:
                exchange.upstream = None
                await response.aclose()
            failed(gateway, exchange, group, error)
    raise all_failed(group)
