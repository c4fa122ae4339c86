"""One request's bookkeeping in one object. An Exchange takes the rate-limit reservation, holds the
backend slot of the current attempt and, exactly once on every path (answer, error, client gone,
cancellation), frees the slot, settles the reservation to the tokens used and writes the usage record.
Handlers use it as `async with`: leaving the block by an exception closes it with that outcome."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time

import anyio
from starlette.requests import ClientDisconnect

from serving.gateway.balancer import BackendState
from serving.gateway.errors import GatewayError, unavailable
from serving.gateway.limits import LimiterUnavailable, Rejection, Reservation

log = logging.getLogger("mlplane.gateway")
CLIENT_GONE = 499  # nginx's status for a client that closed the connection
# request ids: a random prefix per process and a counter (unique across replicas and workers without a
# uuid4 per request, whose os.urandom call costs more than the rest of the id)
_ID_PREFIX = f"req-{os.urandom(8).hex()}-"
_ids = itertools.count(1)
_outliving: set[asyncio.Task] = set()  # limiter calls whose caller was cancelled, kept until they end


def _keep(task: asyncio.Task) -> None:
    """Holds a task nobody awaits any more until it ends (the event loop keeps only weak references)."""
    _outliving.add(task)
    task.add_done_callback(_outliving.discard)


async def outliving_cancellation(call, abandoned=None):
    """Awaits `call` in a task of its own that a cancellation of the caller does not stop. anyio's
    shields do not hold off asyncio's own Task.cancel() (uvicorn's on shutdown), so a limiter call
    that Redis has already run could otherwise lose its answer: the caller is cancelled, the call
    finishes, and `abandoned` gets its task."""
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _keep(task)
        if abandoned is not None:
            task.add_done_callback(abandoned)
        raise


class Exchange:
    def __init__(self, gateway, caller, endpoint: str, model: str):
        self.gateway, self.caller, self.endpoint, self.model = gateway, caller, endpoint, model
        self.request_id = f"{_ID_PREFIX}{next(_ids):x}"
        self.started = time.perf_counter()
        self.reservation: Reservation | None = None
        self.reserved = 0
        self.state: BackendState | None = None  # the backend of the current attempt while its slot is held
        self.backend: BackendState | None = None  # the backend that answered, for the usage record
        self.closed = False
        self.upstream = None  # a streamed backend response to close at the end
        self.streaming = False  # handed to a StreamingExchange, which finishes it

    # admission
    async def admit(self, tokens: int) -> None:
        """Reserves `tokens` (and one request) against every limit of the key and its team: 429 when a
        limit refuses, 503 when the limiter is unreachable (unless settings.rate_limit_failure is open)."""
        gateway = self.gateway
        limits = self.caller.limits
        try:
            if gateway.limiter.suspends:
                acquiring = gateway.limiter.acquire(limits, tokens)
                outcome = await outliving_cancellation(acquiring, lambda task: self._give_back(task, tokens))
            else:
                outcome = await gateway.limiter.acquire(limits, tokens)
        except LimiterUnavailable as error:
            if gateway.settings.rate_limit_failure == "open":
                log.warning("admitting %s unmetered: %s", self.request_id, error)
                self.reservation = Reservation(metered=False)
                return
            log.error("refusing %s: %s", self.request_id, error)
            raise unavailable("The rate limiter is unavailable; retry later", "rate_limiter_unavailable") from error
        if isinstance(outcome, Rejection):
            limit = outcome.limit
            metrics = gateway.metrics
            metrics.child(metrics.rate_limited, limit.scope.split(":")[0], limit.unit, limit.period).inc()
            raise GatewayError(
                429,
                outcome.message(),
                "rate_limit_exceeded",
                f"{limit.unit}_per_{limit.period}_exceeded",
                headers={"Retry-After": str(outcome.retry_after_s)},
            )
        self.reservation, self.reserved = outcome, tokens

    def _give_back(self, acquired: asyncio.Task, tokens: int) -> None:
        """Gives back what Redis reserved for a caller cancelled before it read the answer (finish has
        written its usage record, status 499, as for any cancelled exchange)."""
        if acquired.cancelled() or acquired.exception() is not None:
            return
        reservation = acquired.result()
        if isinstance(reservation, Reservation) and reservation.tokens:
            _keep(asyncio.ensure_future(self._settle(reservation, -tokens)))

    # backend slots
    def take(self, state: BackendState) -> None:
        state.start()
        self.state = state

    def release(self, ok: bool | None, latency_s: float | None = None, ttft_s: float | None = None) -> None:
        """Frees the current attempt's slot: ok True/False counts for or against the backend, None
        (the client went away, or the gateway's own fault) counts neither."""
        state, self.state = self.state, None
        if state is None:
            return
        if ok is None:
            state.release()
        else:
            settings = self.gateway.settings
            state.finish(
                ok,
                latency_s,
                ttft_s,
                settings.circuit_failures,
                settings.circuit_open_s,
                self.caller.key.key_id,
                settings.key_failure_budget,
            )
            metrics = self.gateway.metrics
            metrics.child(metrics.backend_requests, state.spec.url, state.spec.region, "ok" if ok else "failure").inc()
        if ok:
            self.backend = state

    # the end
    async def finish(self, status: int, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """Closes the exchange once: later calls do nothing. The usage record is written first, with no
        suspension before it, so a cancellation cannot lose it; a settlement that waits for Redis
        outlives a cancellation of its caller."""
        if self.closed:
            return
        self.closed = True
        self.release(None)
        if self.upstream is not None:
            self.upstream.close()
        self._record(status, prompt_tokens, completion_tokens)
        reservation = self.reservation
        token_delta = prompt_tokens + completion_tokens - self.reserved
        if reservation is None or not reservation.metered or not reservation.tokens or not token_delta:
            return
        settling = self._settle(reservation, token_delta)
        if self.gateway.limiter.suspends:
            await outliving_cancellation(settling)
        else:
            await settling

    async def _settle(self, reservation: Reservation, token_delta: int) -> None:
        try:
            await self.gateway.limiter.settle(reservation, token_delta)
        except LimiterUnavailable as error:  # the usage record carries the tokens
            log.error("settling %s failed (%+d tokens): %s", self.request_id, token_delta, error)

    def _record(self, status: int, prompt_tokens: int, completion_tokens: int) -> None:
        gateway, key, state = self.gateway, self.caller.key, self.backend
        latency = time.perf_counter() - self.started
        metrics = gateway.metrics
        metrics.child(metrics.requests, self.model, self.endpoint, str(status)).inc()
        metrics.child(metrics.latency, self.model, self.endpoint).observe(latency)
        if prompt_tokens:
            metrics.child(metrics.tokens, self.model, "prompt").inc(prompt_tokens)
        if completion_tokens:
            metrics.child(metrics.tokens, self.model, "completion").inc(completion_tokens)
        gateway.usage.record(
            {
                "request_id": self.request_id,
                "ts": time.time(),
                "key_id": key.key_id,
                "team": key.team,
                "model": self.model,
                "backend": state.spec.url if state else None,
                "region": state.spec.region if state else None,
                "endpoint": self.endpoint,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "latency_ms": latency * 1000,
                "status": status,
            }
        )

    async def __aenter__(self) -> Exchange:
        return self

    async def __aexit__(self, kind, error, _traceback) -> None:
        if kind is None:
            if not self.closed and not self.streaming:  # a handler that forgot: never leak
                log.error("request %s left unfinished by its handler", self.request_id)
                await self.finish(500)
            return
        if isinstance(error, GatewayError):
            status = error.status
        elif issubclass(kind, anyio.get_cancelled_exc_class() | ClientDisconnect):
            status = CLIENT_GONE
        else:
            status = 500
            log.error("request %s failed inside the gateway", self.request_id, exc_info=error)
        await self.finish(status)
