"""The gateway's long-lived state: model groups and their backends, the key store with its cache, the
limiter, usage writer and metrics, plus the background health, reload and key-watch loops."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import httpx

from serving.gateway.balancer import BackendState
from serving.gateway.config import ConfigError, GatewayConfig, load_config
from serving.gateway.errors import GatewayError, unavailable
from serving.gateway.limits import Limit, limiter_for, limits_for
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.store import ApiKey, GatewayStore, Team, hash_key
from serving.gateway.tokens import TokenCounter
from serving.gateway.usage import UsageWriter

log = logging.getLogger("mlplane.gateway")


@dataclass
class ModelGroup:
    name: str
    backends: list[BackendState]
    counter: TokenCounter
    max_tokens: int
    kind: str


@dataclass(frozen=True)
class Caller:
    """An authenticated API key and its team's limits (None when the team has no row)."""

    key: ApiKey
    team: Team | None

    @cached_property
    def limits(self) -> list[Limit]:
        """The key's and its team's limits, worked out once per cached caller (not per request)."""
        return limits_for(self.key, self.team)


class Router:
    """The model groups of one configuration. Reloading builds a new Router that keeps the state
    (latency estimates, in-flight counts, circuits) of backends present in both: requests in flight
    finish on the same state objects, so their slots are freed where they were taken."""

    def __init__(self, config: GatewayConfig, previous: Router | None = None):
        old = {s.spec.id: s for g in (previous.groups.values() if previous else []) for s in g.backends}
        self.groups: dict[str, ModelGroup] = {}
        for name, specs in config.groups.items():
            states = []
            for spec in specs:
                state = old.get(spec.id) or BackendState(spec)
                state.spec = spec
                states.append(state)
            tokenizer = next((s.tokenizer for s in specs if s.tokenizer), None)
            self.groups[name] = ModelGroup(
                name, states, TokenCounter(tokenizer), max(s.max_tokens for s in specs), specs[0].kind
            )


class Gateway:
    def __init__(self, config_path: str | Path):
        self.config_path = Path(config_path)
        self.config = load_config(self.config_path)
        self.config_mtime = self.config_path.stat().st_mtime
        self.router = Router(self.config)
        settings = self.config.settings
        self.store = GatewayStore(settings.store)
        self.limiter = limiter_for(settings.rate_limits, settings.rate_limit_prefix, settings.redis_timeout_s)
        self.metrics = GatewayMetrics()
        self.usage = UsageWriter(self.store, settings.usage_spill_dir)
        self.key_cache: dict[str, tuple[Caller | None, float]] = {}
        self.store_version: tuple | None = None
        self.session = None  # the connection pool to backends (http1.Pool), made on the running loop by start()
        # probes open a fresh connection each time: a pooled one could hide a backend that stopped accepting
        self.health_client = httpx.AsyncClient(
            limits=httpx.Limits(max_keepalive_connections=0), timeout=settings.connect_timeout_s + 1
        )
        self.tasks: list[asyncio.Task] = []

    @property
    def settings(self):
        return self.config.settings

    async def start(self) -> None:
        from serving.gateway.upstream import session_for

        self.session = session_for(self.settings)
        self.usage.start()
        # the objects of startup (modules, the app, its routes and schemas: about a million) live as long
        # as the process: frozen, the collector stops scanning them again and again (7% of the CPU of a
        # request went to gc before)
        gc.collect()
        gc.freeze()
        self.tasks = [
            asyncio.create_task(loop()) for loop in (self._health_loop, self._reload_loop, self._key_watch_loop)
        ]
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests)
            pass

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.usage.close()
        await self.session.close()
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
        except (ConfigError, OSError, ValueError) as error:
            log.error("config reload failed, keeping the running configuration: %s", error)
            return False
        restart_only = ("store", "rate_limits", "rate_limit_prefix", "redis_timeout_s")
        if any(getattr(config.settings, n) != getattr(self.settings, n) for n in restart_only):
            log.warning("settings %s take effect on restart only", ", ".join(restart_only))
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

    async def _key_watch_loop(self) -> None:
        """Drops the key cache when any replica or the CLI revoked or rotated a key or changed a team:
        such changes hold everywhere within key_watch_s, whatever key_cache_s is."""
        while True:
            try:
                version = await asyncio.to_thread(self.store.version)
                if version != self.store_version:
                    self.key_cache.clear()
                    self.store_version = version
            except Exception as error:  # the store is down: cached keys serve until key_cache_s
                log.warning("key watch failed: %s", error)
            await asyncio.sleep(self.settings.key_watch_s)

    # authentication
    async def authenticate(self, secret: str) -> Caller:
        """The caller of a bearer secret, or a 401 (a 503 when the key store cannot be read)."""
        if not secret:
            raise GatewayError(
                401, "Missing API key: send 'Authorization: Bearer <key>'", "invalid_request_error", "invalid_api_key"
            )
        digest = hash_key(secret)
        now = time.time()
        cached = self.key_cache.get(digest)
        if cached is not None and now - cached[1] < self.settings.key_cache_s:
            caller = cached[0]
        else:
            try:
                found = await asyncio.to_thread(self.store.lookup, secret)
            except Exception as error:  # any driver error: the store is unreachable or broken
                log.error("key store lookup failed: %s", error)
                raise unavailable("The API key store is unavailable; retry later", "key_store_unavailable") from error
            caller = Caller(*found) if found else None
            if len(self.key_cache) > 10_000:  # bounded: unknown keys must not grow it without end
                self.key_cache.clear()
            self.key_cache[digest] = (caller, now)
        if caller is None:
            raise GatewayError(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")
        problem = caller.key.problem(now)
        if problem:
            raise GatewayError(401, problem.capitalize(), "invalid_request_error", "invalid_api_key")
        return caller

    def group_for(self, caller: Caller, model: str, kind: str) -> ModelGroup:
        group = self.router.groups.get(model)
        if group is None or group.kind != kind:
            raise GatewayError(
                404, f"The model '{model}' does not exist", "invalid_request_error", "model_not_found", "model"
            )
        if not caller.key.allows(model):
            raise GatewayError(
                403,
                f"This API key is not allowed to use the model '{model}'",
                "permission_error",
                "model_not_allowed",
                "model",
            )
        return group
