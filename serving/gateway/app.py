"""The gateway's HTTP service: OpenAI-compatible routes, an Open Inference Protocol v2 pass-through,
the admin API for keys and usage, and Prometheus metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving.gateway.balancer import BackendState, choose
from serving.gateway.config import ConfigError, GatewayConfig, load_config
from serving.gateway.limits import Rejection, Reservation, limiter_for, limits_for
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.store import LIMIT_FIELDS, ApiKey, GatewayStore, hash_key
from serving.gateway.tokens import TokenCounter
from serving.gateway.usage import UsageWriter

log = logging.getLogger("mlplane.gateway")
REGION_HEADER = "x-mlplane-region"
ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


class GatewayError(Exception):
    """An error answered to the client in OpenAI's shape."""

    def __init__(self, status: int, message: str, type_: str, code: str | None = None,
                 param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class BackendFailure(Exception):
    """The backend failed before the first byte reached the client: another backend may be tried."""


@dataclass
class ModelGroup:
    name: str
    backends: list[BackendState]
    counter: TokenCounter
    max_tokens: int
    kind: str


class Router:
    """The model groups of one configuration. Reloading builds a new Router that keeps the state
    (latency estimates, in-flight counts, circuits) of backends present in both."""

    def __init__(self, config: GatewayConfig, previous: Router | None = None):
        self.config = config
        old = {s.spec.id: s for g in (previous.groups.values() if previous else []) for s in g.backends}
        self.groups: dict[str, ModelGroup] = {}
        for name, specs in config.groups.items():
            states = []
            for spec in specs:
                state = old.get(spec.id) or BackendState(spec)
                state.spec = spec
                states.append(state)
            tokenizer = next((s.tokenizer for s in specs if s.tokenizer), None)
            self.groups[name] = ModelGroup(name, states, TokenCounter(tokenizer),
                                           max(s.max_tokens for s in specs), specs[0].kind)


class Gateway:
    def __init__(self, config_path: str | Path):
        self.config_path = Path(config_path)
        self.config = load_config(self.config_path)
        self.config_mtime = self.config_path.stat().st_mtime
        self.router = Router(self.config)
        settings = self.config.settings
        self.store = GatewayStore(settings.store)
        self.limiter = limiter_for(settings.rate_limits, settings.rate_limit_prefix)
        self.metrics = GatewayMetrics()
        self.usage = UsageWriter(self.store)
        self.key_cache: dict[str, tuple[ApiKey | None, float]] = {}
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.request_timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
        )
        # probes open a fresh connection each time: a pooled one could hide a backend that stopped accepting
        self.health_client = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0),
                                               timeout=settings.connect_timeout_s + 1)
        self.tasks: list[asyncio.Task] = []

    @property
    def settings(self):
        return self.config.settings

    async def start(self) -> None:
        self.usage.start()
        self.tasks = [asyncio.create_task(self._health_loop()), asyncio.create_task(self._reload_loop())]
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests)
            pass

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.usage.close()
        await self.client.aclose()
        await self.health_client.aclose()
        await self.limiter.close()
        self.store.close()

    # configuration
    def reload(self) -> bool:
        """Swap in the configuration file's model list; in-flight requests keep the backends they hold."""
        try:
            config = load_config(self.config_path)
            self.config_mtime = self.config_path.stat().st_mtime
            router = Router(config, previous=self.router)  # loads tokenizers: a bad path fails here
        except (ConfigError, OSError, TypeError) as error:
            log.error("config reload failed, keeping the running configuration: %s", error)
            return False
        if (config.settings.store, config.settings.rate_limits) != (self.settings.store, self.settings.rate_limits):
            log.warning("settings.store and settings.rate_limits take effect on restart only")
        self.router = router
        self.config = config
        log.info("configuration reloaded: %d model groups", len(self.router.groups))
        return True

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reload_interval_s)
            try:
                mtime = self.config_path.stat().st_mtime
            except OSError:
                continue
            if mtime != self.config_mtime:
                self.config_mtime = mtime  # a broken file is reported once, not at every poll
                self.reload()

    async def _health_loop(self) -> None:
        while True:
            groups = self.router.groups
            await asyncio.gather(*(self._check(s) for g in groups.values() for s in g.backends))
            await asyncio.sleep(self.settings.health_interval_s)

    async def _check(self, state: BackendState) -> None:
        path = "/health" if state.spec.kind == "openai" else "/v2/health/ready"
        try:
            response = await self.health_client.get(state.spec.url + path)
            state.healthy = response.status_code == 200
        except httpx.TimeoutException:
            pass  # a busy backend answers probes late; requests that time out open its circuit breaker instead
        except httpx.HTTPError:
            state.healthy = False

    # authentication and limits
    async def authenticate(self, request: Request) -> ApiKey:
        header = request.headers.get("authorization", "")
        secret = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not secret:
            raise GatewayError(401, "Missing API key: send 'Authorization: Bearer <key>'",
                               "invalid_request_error", "invalid_api_key")
        digest = hash_key(secret)
        now = time.time()
        cached = self.key_cache.get(digest)
        if cached is not None and now - cached[1] < self.settings.key_cache_s:
            key = cached[0]
        else:
            key = await asyncio.to_thread(self.store.lookup, secret)
            if len(self.key_cache) > 10_000:  # bounded: unknown keys must not grow it without end
                self.key_cache.clear()
            self.key_cache[digest] = (key, now)
        if key is None:
            raise GatewayError(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")
        problem = key.problem(now)
        if problem:
            raise GatewayError(401, problem.capitalize(), "invalid_request_error", "invalid_api_key")
        return key

    def group_for(self, key: ApiKey, model, kind: str) -> ModelGroup:
        if not isinstance(model, str) or not model:
            raise GatewayError(400, "'model' is required and must be a string", "invalid_request_error",
                               "invalid_value", "model")
        group = self.router.groups.get(model)
        if group is None or group.kind != kind:
            raise GatewayError(404, f"The model '{model}' does not exist", "invalid_request_error",
                               "model_not_found", "model")
        if not key.allows(model):
            raise GatewayError(403, f"This API key is not allowed to use the model '{model}'",
                               "permission_error", "model_not_allowed", "model")
        return group

    async def reserve(self, key: ApiKey, tokens: int) -> Reservation:
        outcome = await self.limiter.acquire(limits_for(key), tokens)
        if isinstance(outcome, Rejection):
            limit = outcome.limit
            self.metrics.rate_limited.labels(limit.scope.split(":")[0], limit.unit, limit.period).inc()
            raise GatewayError(429, outcome.message(), "rate_limit_exceeded",
                               f"{limit.unit}_per_{limit.period}_exceeded",
                               headers={"Retry-After": str(outcome.retry_after_s)})
        return outcome

    # forwarding
    def pick(self, group: ModelGroup, region: str | None, tried: set[str]) -> BackendState:
        state = choose(group.backends, region, tried, self.settings.spill_factor)
        if state is None:
            raise GatewayError(503, f"No backend of model '{group.name}' is available; retry later",
                               "service_unavailable", "no_backend_available",
                               headers={"Retry-After": str(int(self.settings.circuit_open_s))})
        return state

    def finish(self, state: BackendState, ok: bool, latency: float | None, ttft: float | None = None) -> None:
        state.finish(ok, latency, ttft, self.settings.circuit_failures, self.settings.circuit_open_s)
        self.metrics.backend_requests.labels(state.spec.url, state.spec.region, "ok" if ok else "failure").inc()

    def attempts(self, group: ModelGroup, region: str | None):
        """Backends to try in turn, each marked started: the best one (503 when none is available),
        then others not tried yet, up to `max_attempts`."""
        tried: set[str] = set()
        for attempt in range(self.settings.max_attempts):
            state = self.pick(group, region, tried) if attempt == 0 else \
                choose(group.backends, region, tried, self.settings.spill_factor)
            if state is None:
                return
            tried.add(state.spec.id)
            state.start()
            yield state

    def failed(self, group: ModelGroup, state: BackendState, error: Exception) -> str:
        """Books a failed attempt before the first byte; returns its description."""
        self.finish(state, False, None)
        if isinstance(error, httpx.TransportError):
            state.healthy = isinstance(error, httpx.TimeoutException)  # a refused connection marks it down now
        description = f"{state.spec.url}: {type(error).__name__}: {error}"
        log.warning("backend attempt failed before the first byte, trying another: %s", description)
        self.metrics.retries.labels(group.name).inc()
        return description

    @staticmethod
    def all_failed(group: ModelGroup, last_error: str) -> GatewayError:
        return GatewayError(502, f"Every backend of model '{group.name}' failed; last error: {last_error}",
                            "upstream_error", "backend_failed")

    async def forward(self, group: ModelGroup, method: str, url_of, body: dict | None, region: str | None,
                      parse_json: bool = True):
        """A non-streaming call, moved to another backend on a transport error, a 5xx or (with `parse_json`)
        an unreadable answer. A 4xx is the client's and is passed on: it never counts against the backend.
        Returns (state, response, payload)."""
        last_error = ""
        for state in self.attempts(group, region):
            started = time.perf_counter()
            try:
                response = await self.client.request(method, url_of(state), json=self._upstream(body, state))
                if response.status_code >= 500:
                    raise BackendFailure(f"HTTP {response.status_code}: {response.text[:200]}")
                payload = response.json() if parse_json else None
            except (httpx.HTTPError, BackendFailure, ValueError) as error:
                last_error = self.failed(group, state, error)
                continue
            self.finish(state, True, time.perf_counter() - started)
            return state, response, payload
        raise self.all_failed(group, last_error)

    @staticmethod
    def _upstream(body: dict | None, state: BackendState) -> dict | None:
        return {**body, "model": state.spec.model} if state.spec.kind == "openai" else body

    async def open_stream(self, group: ModelGroup, body: dict, region: str | None, path: str):
        """Opens a streamed call and reads its first chunk; failures up to then move to another backend.
        Returns (state, response, first_chunk, lines, started)."""
        last_error = ""
        for state in self.attempts(group, region):
            started = time.perf_counter()
            response = None
            try:
                request = self.client.build_request("POST", state.spec.url + path, json=self._upstream(body, state))
                response = await self.client.send(request, stream=True)
                if response.status_code >= 400:
                    content = await response.aread()
                    await response.aclose()
                    if response.status_code >= 500:
                        raise BackendFailure(f"HTTP {response.status_code}: {content[:200]!r}")
                    self.finish(state, True, time.perf_counter() - started)
                    return state, response, content, None, started
                lines = response.aiter_lines()
                first = await anext(lines)
                return state, response, first, lines, started
            except (httpx.HTTPError, BackendFailure, StopAsyncIteration) as error:
                if response is not None:
                    await response.aclose()
                last_error = self.failed(group, state, error)
        raise self.all_failed(group, last_error)

    def record(self, request_id: str, key: ApiKey, model: str, endpoint: str, state: BackendState | None,
               prompt_tokens: int, completion_tokens: int, started: float, status: int) -> None:
        latency = time.perf_counter() - started
        self.metrics.requests.labels(model, endpoint, str(status)).inc()
        self.metrics.latency.labels(model, endpoint).observe(latency)
        self.metrics.tokens.labels(model, "prompt").inc(prompt_tokens)
        self.metrics.tokens.labels(model, "completion").inc(completion_tokens)
        self.usage.record({
            "request_id": request_id, "ts": time.time(), "key_id": key.key_id, "team": key.team, "model": model,
            "backend": state.spec.url if state else None, "region": state.spec.region if state else None,
            "endpoint": endpoint, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "latency_ms": latency * 1000, "status": status,
        })


async def read_json(request: Request, max_bytes: int) -> dict:
    """The request body as a JSON object, or a 4xx naming the problem."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise GatewayError(413, f"Request body of {declared} bytes is over the limit of {max_bytes} bytes",
                           "invalid_request_error", "request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise GatewayError(413, f"Request body is over the limit of {max_bytes} bytes",
                               "invalid_request_error", "request_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise GatewayError(400, f"The request body is not valid JSON: {error}", "invalid_request_error",
                           "invalid_json") from error
    if not isinstance(body, dict):
        raise GatewayError(400, "The request body must be a JSON object", "invalid_request_error", "invalid_json")
    return body


def body_schema(required: list[str], properties: dict) -> dict:
    """OpenAPI request body (the handlers parse the raw body to answer malformed JSON in OpenAI's shape)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": required, "properties": properties, "additionalProperties": True}}}}}


CHAT_SCHEMA = body_schema(["model", "messages"], {
    "model": {"type": "string"}, "messages": {"type": "array", "items": {"type": "object"}},
    "stream": {"type": "boolean"}, "max_tokens": {"type": "integer"}, "temperature": {"type": "number"}})
COMPLETIONS_SCHEMA = body_schema(["model", "prompt"], {
    "model": {"type": "string"}, "prompt": {}, "stream": {"type": "boolean"}, "max_tokens": {"type": "integer"}})
EMBEDDINGS_SCHEMA = body_schema(["model", "input"], {"model": {"type": "string"}, "input": {}})
KEY_SCHEMA = body_schema(["owner", "team"], {
    "owner": {"type": "string"}, "team": {"type": "string"}, "models": {"type": "array", "items": {"type": "string"}},
    "expires_at": {"type": "number", "description": "Unix time"},
    **{name: {"type": "integer"} for name in LIMIT_FIELDS}})


def create_app(config_path: str | Path) -> FastAPI:
    gateway = Gateway(config_path)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="mlplane ML gateway", version="1.0",
                  description="One OpenAI-compatible API over model backends in several regions.", lifespan=lifespan)
    app.state.gateway = gateway

    @app.exception_handler(GatewayError)
    async def gateway_error(_request: Request, error: GatewayError):
        return error.response()

    async def generate(request: Request, endpoint: str):
        started = time.perf_counter()
        key = await gateway.authenticate(request)
        body: dict = {}
        try:
            body = await read_json(request, gateway.settings.max_body_bytes)
            group = gateway.group_for(key, body.get("model"), "openai")
            checked = check_request(body, group, endpoint)
        except GatewayError as error:  # refused before any backend call: still one usage record
            model = body.get("model")
            known = model if isinstance(model, str) and model in gateway.router.groups else "unknown"
            gateway.record(f"req-{uuid.uuid4().hex}", key, known, endpoint, None, 0, 0, started, error.status)
            raise
        return await call(request, key, group, endpoint, body, *checked, started)

    def check_request(body: dict, group: ModelGroup, endpoint: str) -> tuple[int, int]:
        """Validates the body; returns the prompt tokens and the completion cap to reserve."""
        field = {"chat": "messages", "completions": "prompt", "embeddings": "input"}[endpoint]
        if not body.get(field):
            raise GatewayError(400, f"'{field}' is required", "invalid_request_error", "invalid_value", field)
        prompt_tokens = group.counter.prompt_tokens(endpoint, body)
        completion_cap = 0
        if endpoint != "embeddings":
            cap_field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
            completion_cap = body.get(cap_field) or group.max_tokens
            if not isinstance(completion_cap, int) or completion_cap < 1:
                raise GatewayError(400, f"'{cap_field}' must be a positive integer", "invalid_request_error",
                                   "invalid_value", cap_field)
            body[cap_field] = completion_cap  # the reservation holds only with a cap
        return prompt_tokens, completion_cap

    async def call(request, key, group, endpoint, body, prompt_tokens, completion_cap, started):
        try:
            reservation = await gateway.reserve(key, prompt_tokens + completion_cap)
        except GatewayError as error:
            gateway.record(f"req-{uuid.uuid4().hex}", key, group.name, endpoint, None, 0, 0, started, error.status)
            raise
        region = request.headers.get(REGION_HEADER) or None
        request_id = f"req-{uuid.uuid4().hex}"
        if body.get("stream") and endpoint != "embeddings":
            return await stream(request_id, key, group, endpoint, body, region, reservation, prompt_tokens,
                                completion_cap, started)
        path = ENDPOINT_PATHS[endpoint]
        try:
            state, response, payload = await gateway.forward(group, "POST", lambda s: s.spec.url + path, body, region)
        except GatewayError as error:
            await gateway.limiter.settle(reservation, -(prompt_tokens + completion_cap))
            gateway.record(request_id, key, group.name, endpoint, None, 0, 0, started, error.status)
            raise
        usage = payload.get("usage") or {} if isinstance(payload, dict) else {}
        used_prompt = usage.get("prompt_tokens", prompt_tokens) if response.status_code < 400 else 0
        used_completion = usage.get("completion_tokens", 0) if response.status_code < 400 else 0
        await gateway.limiter.settle(reservation, used_prompt + used_completion - prompt_tokens - completion_cap)
        if isinstance(payload, dict) and "model" in payload:
            payload["model"] = group.name
        gateway.record(request_id, key, group.name, endpoint, state, used_prompt, used_completion, started,
                       response.status_code)
        return JSONResponse(payload, status_code=response.status_code)

    async def stream(request_id, key, group, endpoint, body, region, reservation, prompt_tokens, cap, started):
        client_wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
        try:
            state, response, first, lines, opened = await gateway.open_stream(
                group, body, region, ENDPOINT_PATHS[endpoint])
        except GatewayError as error:
            await gateway.limiter.settle(reservation, -(prompt_tokens + cap))
            gateway.record(request_id, key, group.name, endpoint, None, 0, 0, started, error.status)
            raise
        if lines is None:  # the backend refused the request (4xx): pass its answer on
            await gateway.limiter.settle(reservation, -(prompt_tokens + cap))
            gateway.record(request_id, key, group.name, endpoint, state, 0, 0, started, response.status_code)
            return Response(first, status_code=response.status_code, media_type="application/json")
        ttft = time.perf_counter() - opened
        gateway.metrics.ttft.labels(group.name).observe(ttft)

        async def events():
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0}
            chunks = 0
            status = 200
            ok = False
            try:
                line = first
                while True:
                    out = line
                    if line.startswith("data: ") and line != "data: [DONE]":
                        try:
                            event = json.loads(line[6:])
                        except json.JSONDecodeError:
                            event = None
                        if isinstance(event, dict):
                            if event.get("usage"):
                                usage = event["usage"]
                            if event.get("choices"):
                                chunks += 1
                            elif event.get("usage") and not client_wants_usage:
                                out = None  # the usage chunk we asked for on the client's behalf
                            if out is not None:
                                event["model"] = group.name
                                out = "data: " + json.dumps(event, separators=(",", ":"))
                    if out is not None:
                        yield out + "\n"
                    line = await anext(lines)
            except StopAsyncIteration:
                ok = True
            except httpx.HTTPError as error:  # after the first byte: never retried, the client is told
                status = 502
                message = f"The backend failed during the stream: {type(error).__name__}"
                yield "data: " + json.dumps({"error": {"message": message, "type": "upstream_error",
                                                       "code": "stream_interrupted", "param": None}}) + "\n\n"
            finally:
                await response.aclose()
                if not ok and status == 200:
                    status = 499  # the client went away
                gateway.finish(state, ok, time.perf_counter() - opened if ok else None, ttft)
                completion = usage.get("completion_tokens") or chunks
                used_prompt = usage.get("prompt_tokens", prompt_tokens)
                await gateway.limiter.settle(reservation, used_prompt + completion - prompt_tokens - cap)
                gateway.record(request_id, key, group.name, endpoint, state, used_prompt, completion, started, status)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Request-Id": request_id})

    @app.post("/v1/chat/completions", tags=["openai"], openapi_extra=CHAT_SCHEMA,
              summary="Chat completion (server-sent events when stream is true)")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    @app.post("/v1/completions", tags=["openai"], openapi_extra=COMPLETIONS_SCHEMA, summary="Text completion")
    async def completions(request: Request):
        return await generate(request, "completions")

    @app.post("/v1/embeddings", tags=["openai"], openapi_extra=EMBEDDINGS_SCHEMA, summary="Embeddings")
    async def embeddings(request: Request):
        return await generate(request, "embeddings")

    @app.get("/v1/models", tags=["openai"], summary="Models this key may use")
    async def models(request: Request):
        key = await gateway.authenticate(request)
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "mlplane",
                 "regions": sorted({s.spec.region for s in g.backends})}
                for name, g in sorted(gateway.router.groups.items()) if g.kind == "openai" and key.allows(name)]
        return {"object": "list", "data": data}

    @app.get("/v2/models/{name}", tags=["open inference protocol v2"], summary="Model metadata (pass-through)")
    async def v2_metadata(name: str, request: Request):
        return await v2_call(name, request, "GET", "")

    @app.post("/v2/models/{name}/infer", tags=["open inference protocol v2"], summary="Inference (pass-through)",
              openapi_extra=body_schema(["inputs"], {"inputs": {"type": "array", "items": {"type": "object"}}}))
    async def v2_infer(name: str, request: Request):
        return await v2_call(name, request, "POST", "/infer")

    async def v2_call(name: str, request: Request, method: str, suffix: str):
        started = time.perf_counter()
        key = await gateway.authenticate(request)
        group = gateway.group_for(key, name, "v2")
        body = await read_json(request, gateway.settings.max_body_bytes) if method == "POST" else None
        await gateway.reserve(key, 0)  # v2 calls count against request limits; they carry no tokens
        request_id = f"req-{uuid.uuid4().hex}"
        region = request.headers.get(REGION_HEADER) or None
        try:
            state, response, _ = await gateway.forward(
                group, method, lambda s: f"{s.spec.url}/v2/models/{s.spec.model}{suffix}", body, region,
                parse_json=False)
        except GatewayError as error:
            gateway.record(request_id, key, name, "v2", None, 0, 0, started, error.status)
            raise
        gateway.record(request_id, key, name, "v2", state, 0, 0, started, response.status_code)
        return Response(response.content, status_code=response.status_code,
                        media_type=response.headers.get("content-type", "application/json"))

    # admin API
    def admin(request: Request) -> None:
        expected = gateway.config.admin_key
        if not expected:
            raise GatewayError(403, f"The admin API is disabled: set {gateway.settings.admin_key_env}",
                               "permission_error", "admin_disabled")
        if request.headers.get("authorization", "") != f"Bearer {expected}":
            raise GatewayError(401, "The admin API needs the admin key", "invalid_request_error", "invalid_api_key")

    @app.post("/admin/keys", tags=["admin"], openapi_extra=KEY_SCHEMA, summary="Create an API key")
    async def create_key(request: Request):
        admin(request)
        body = await read_json(request, gateway.settings.max_body_bytes)
        unknown = set(body) - {"owner", "team", "models", "expires_at", *LIMIT_FIELDS}
        if unknown:
            raise GatewayError(400, f"Unknown fields {sorted(unknown)}", "invalid_request_error", "invalid_value")
        try:
            secret, record = await asyncio.to_thread(gateway.store.create_key, **body)
        except (ValueError, TypeError) as error:
            raise GatewayError(400, str(error), "invalid_request_error", "invalid_value") from error
        return JSONResponse({"key": secret, **record.public()}, status_code=201)

    @app.get("/admin/keys", tags=["admin"], summary="List API keys (never their secrets)")
    async def list_keys(request: Request):
        admin(request)
        return {"data": [k.public() for k in await asyncio.to_thread(gateway.store.list_keys)]}

    @app.post("/admin/keys/{key_id}/revoke", tags=["admin"], summary="Revoke an API key")
    async def revoke_key(key_id: str, request: Request):
        admin(request)
        try:
            record = await asyncio.to_thread(gateway.store.revoke_key, key_id)
        except KeyError as error:
            raise GatewayError(404, error.args[0], "invalid_request_error", "key_not_found") from error
        gateway.key_cache.clear()
        return record.public()

    @app.post("/admin/keys/{key_id}/rotate", tags=["admin"], summary="Give an API key a new secret")
    async def rotate_key(key_id: str, request: Request):
        admin(request)
        try:
            secret, record = await asyncio.to_thread(gateway.store.rotate_key, key_id)
        except KeyError as error:
            raise GatewayError(404, error.args[0], "invalid_request_error", "key_not_found") from error
        except ValueError as error:
            raise GatewayError(409, str(error), "invalid_request_error", "key_revoked") from error
        gateway.key_cache.clear()
        return {"key": secret, **record.public()}

    @app.get("/admin/usage", tags=["admin"], summary="Usage report: requests and tokens per group")
    async def usage_report(request: Request, since: float = 0.0, until: float | None = None,
                           group_by: str = "key_id,team,model"):
        admin(request)
        try:
            rows = await asyncio.to_thread(gateway.store.usage_report, since, until, tuple(group_by.split(",")))
        except ValueError as error:
            raise GatewayError(400, str(error), "invalid_request_error", "invalid_value", "group_by") from error
        return {"data": rows}

    @app.post("/admin/reload", tags=["admin"], summary="Reload the configuration file now")
    async def reload(request: Request):
        admin(request)
        if not gateway.reload():
            raise GatewayError(400, "The configuration file is invalid; the running one is kept (see the log)",
                               "invalid_request_error", "invalid_config")
        return {"models": sorted(gateway.router.groups)}

    @app.get("/health", tags=["ops"], summary="Liveness")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics")
    async def metrics():
        gateway.metrics.observe_backends({n: g.backends for n, g in gateway.router.groups.items()})
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
