"""Token-count and request-count rate limits per key and per team, over fixed per-minute and per-day
windows. A request reserves its prompt tokens plus its completion cap (max_tokens) atomically across
every limit that applies; when it finishes the reservation is settled to the tokens really used. So the
tokens admitted in a window never exceed the limit by more than what backends return beyond max_tokens.

`MemoryLimiter` serves one replica; `RedisLimiter` shares the counters between replicas with one Lua
script per admission (check-all-then-increment-all, atomic on the server)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

PERIODS = {"minute": 60, "day": 86_400}


@dataclass(frozen=True)
class Limit:
    scope: str  # "key:<id>" or "team:<name>"
    unit: str  # "tokens" or "requests"
    period: str  # "minute" or "day"
    limit: int

    def describe(self) -> str:
        return f"{self.scope} {self.unit} per {self.period} ({self.limit})"


@dataclass
class Reservation:
    counters: list[tuple[str, int, int]] = field(default_factory=list)  # (counter, cost, ttl)

    @property
    def token_counters(self) -> list[str]:
        return [name for name, _cost, _ttl in self.counters if ":tokens:" in name]


@dataclass(frozen=True)
class Rejection:
    limit: Limit
    retry_after_s: int
    needed: int

    def message(self) -> str:
        if self.needed > self.limit.limit:
            return (f"Rate limit: this request needs {self.needed} {self.limit.unit}, more than the limit of "
                    f"{self.limit.describe()}; lower max_tokens or the prompt")
        return f"Rate limit reached for {self.limit.describe()}; retry after {self.retry_after_s} s"


def limits_for(key) -> list[Limit]:
    """The limits that apply to an ApiKey: its own and its team's."""
    limits = []
    for scope, prefix in ((f"key:{key.key_id}", ""), (f"team:{key.team}", "team_")):
        for unit, letter in (("requests", "r"), ("tokens", "t")):
            for period, suffix in (("minute", "pm"), ("day", "pd")):
                value = getattr(key, f"{prefix}{letter}{suffix}")
                if value is not None:
                    limits.append(Limit(scope, unit, period, int(value)))
    return limits


class _Windows:
    def __init__(self, prefix: str, clock=time.time):
        self.prefix = prefix
        self.clock = clock

    def plan(self, limits: list[Limit], tokens: int) -> tuple[list[tuple[str, int, int, Limit]], float]:
        now = self.clock()
        plan = []
        for limit in limits:
            seconds = PERIODS[limit.period]
            window = int(now // seconds)
            name = f"{self.prefix}:{limit.scope}:{limit.unit}:{limit.period}:{window}"
            cost = tokens if limit.unit == "tokens" else 1
            ttl = int((window + 1) * seconds - now) + 1
            plan.append((name, cost, ttl, limit))
        return plan, now


class MemoryLimiter(_Windows):
    """In-process counters. Check and increment run without an await between them, so they are atomic
    on the event loop."""

    def __init__(self, prefix: str = "mlplane:gateway", clock=time.time):
        super().__init__(prefix, clock)
        self.counts: dict[str, int] = {}
        self.expiry: dict[str, float] = {}

    async def acquire(self, limits: list[Limit], tokens: int) -> Reservation | Rejection:
        plan, now = self.plan(limits, tokens)
        self._expire(now)
        for name, cost, ttl, limit in plan:
            if self.counts.get(name, 0) + cost > limit.limit:
                return Rejection(limit, ttl, cost)
        for name, cost, ttl, _limit in plan:
            self.counts[name] = self.counts.get(name, 0) + cost
            self.expiry[name] = now + ttl
        return Reservation([(name, cost, ttl) for name, cost, ttl, _ in plan])

    async def settle(self, reservation: Reservation, token_delta: int) -> None:
        for name in reservation.token_counters:
            if name in self.counts:
                self.counts[name] += token_delta

    def _expire(self, now: float) -> None:
        if len(self.expiry) > 10_000:
            for name in [n for n, t in self.expiry.items() if t < now]:
                self.counts.pop(name, None)
                self.expiry.pop(name, None)

    async def close(self) -> None:
        return None


ACQUIRE_LUA = """
local n = #KEYS
for i = 1, n do
  local current = tonumber(redis.call('GET', KEYS[i]) or '0')
  if current + tonumber(ARGV[i]) > tonumber(ARGV[n + i]) then return i end
end
for i = 1, n do
  redis.call('INCRBY', KEYS[i], ARGV[i])
  redis.call('EXPIRE', KEYS[i], ARGV[2 * n + i])
end
return 0
"""
# Settles only counters still alive: a window that ended meanwhile must not come back without a TTL.
SETTLE_LUA = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], ARGV[1]) end
end
return 0
"""


class RedisLimiter(_Windows):
    """Counters in Redis shared by every gateway replica."""

    def __init__(self, url: str, prefix: str = "mlplane:gateway", clock=time.time):
        import redis.asyncio as aioredis

        super().__init__(prefix, clock)
        self.redis = aioredis.from_url(url)
        self.acquire_script = self.redis.register_script(ACQUIRE_LUA)
        self.settle_script = self.redis.register_script(SETTLE_LUA)

    async def acquire(self, limits: list[Limit], tokens: int) -> Reservation | Rejection:
        if not limits:
            return Reservation()
        plan, _now = self.plan(limits, tokens)
        names = [p[0] for p in plan]
        args = [p[1] for p in plan] + [p[3].limit for p in plan] + [p[2] for p in plan]
        violated = int(await self.acquire_script(keys=names, args=args))
        if violated:
            _name, cost, ttl, limit = plan[violated - 1]
            return Rejection(limit, ttl, cost)
        return Reservation([(name, cost, ttl) for name, cost, ttl, _ in plan])

    async def settle(self, reservation: Reservation, token_delta: int) -> None:
        if token_delta and reservation.token_counters:
            await self.settle_script(keys=reservation.token_counters, args=[token_delta])

    async def close(self) -> None:
        await self.redis.aclose()


def limiter_for(setting: str, prefix: str):
    if setting == "memory":
        return MemoryLimiter(prefix)
    if setting.startswith(("redis://", "rediss://", "unix://")):
        return RedisLimiter(setting, prefix)
    raise ValueError(f"settings.rate_limits must be 'memory' or a redis:// URL, not {setting!r}")
