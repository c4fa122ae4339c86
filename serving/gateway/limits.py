"""Token-count and request-count rate limits per key and per team over sliding 60-second and 24-hour
windows. Each window is kept as a ring of sub-buckets (60 of one second, 144 of ten minutes); a request
is admitted only if every bucket that overlaps the last period, plus its cost, fits the limit. So the
amount admitted in ANY window of the period's length never exceeds the limit (a fixed window lets twice
the limit through across its boundary); the price is that a refusal may last up to one bucket longer
than strictly needed.

A request reserves its prompt tokens plus everything it may generate atomically across every limit
that applies; when it finishes the reservation is settled to the tokens really used, in the bucket it
was taken from. `MemoryLimiter` serves one process; `RedisLimiter` shares the buckets between
replicas and workers with one Lua script per admission (check-all-then-add-all, atomic on the server,
timed by Redis' own clock)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property

from serving.gateway.resp import LuaScript, RedisReplyError, RedisUnavailable, RespClient

# period -> (seconds, buckets)
PERIODS = {"minute": (60, 60), "day": (86_400, 144)}


class LimiterUnavailable(RuntimeError):
    """The shared counters cannot be reached (Redis down or hanging)."""


@dataclass(frozen=True)
class Limit:
    scope: str  # "key:<id>" or "team:<name>"
    unit: str  # "tokens" or "requests"
    period: str  # "minute" or "day"
    limit: int

    def describe(self) -> str:
        return f"{self.scope} {self.unit} per {self.period} ({self.limit})"

    @cached_property
    def bucket_s(self) -> float:
        seconds, buckets = PERIODS[self.period]
        return seconds / buckets

    @cached_property
    def buckets(self) -> int:
        return PERIODS[self.period][1]


@dataclass
class Reservation:
    tokens: list[tuple[str, int]] = field(default_factory=list)  # (counter, bucket) holding the token cost
    metered: bool = True
    at: float = 0.0  # the limiter's clock at admission


@dataclass(frozen=True)
class Rejection:
    limit: Limit
    retry_after_s: int
    needed: int

    def message(self) -> str:
        if self.needed > self.limit.limit:
            return (
                f"Rate limit: this request needs {self.needed} {self.limit.unit}, more than the limit of "
                f"{self.limit.describe()}; lower max_tokens, n or the prompt"
            )
        return f"Rate limit reached for {self.limit.describe()}; retry after {self.retry_after_s} s"


def limits_for(key, team=None) -> list[Limit]:
    """The limits that apply to an ApiKey: its own, and its team's from the team table."""
    limits = []
    for scope, holder in ((f"key:{key.key_id}", key), (f"team:{key.team}", team)):
        if holder is None:
            continue
        for unit, letter in (("requests", "r"), ("tokens", "t")):
            for period, suffix in (("minute", "pm"), ("day", "pd")):
                value = getattr(holder, f"{letter}{suffix}")
                if value is not None:
                    limits.append(Limit(scope, unit, period, int(value)))
    return limits


def cost_of(limit: Limit, tokens: int) -> int:
    return tokens if limit.unit == "tokens" else 1


def retry_after(limit: Limit, live: dict[int, int], now: float, cost: int) -> int:
    """Seconds until enough of the oldest buckets leave the window for `cost` to fit."""
    if cost > limit.limit:
        return PERIODS[limit.period][0]
    total = sum(live.values())
    for bucket in sorted(live):
        total -= live[bucket]
        if total + cost <= limit.limit:
            return max(1, math.ceil((bucket + limit.buckets + 1) * limit.bucket_s - now))
    return 1


class MemoryLimiter:
    """In-process buckets. Check and add run without an await between them: atomic on the event loop."""

    suspends = False  # acquire() and settle() never wait: no cancellation can land inside them

    def __init__(self, prefix: str = "mlplane:gateway", clock=time.time):
        self.prefix, self.clock = prefix, clock
        self.counters: dict[str, dict[int, int]] = {}
        self.pruned_at: dict[str, int] = {}  # the current bucket of each counter's last pruning

    async def acquire(self, limits: list[Limit], tokens: int) -> Reservation | Rejection:
        now = self.clock()
        plan = []
        for limit in limits:
            name = f"{self.prefix}:{limit.scope}:{limit.unit}:{limit.period}"
            current = int(now // limit.bucket_s)
            buckets = self.counters.get(name)
            if buckets is None:
                buckets = self.counters[name] = {}
            if self.pruned_at.get(name) != current:  # buckets leave the window only when the current one moves
                self.pruned_at[name] = current
                oldest = current - limit.buckets
                for stale in [b for b in buckets if b < oldest]:
                    del buckets[stale]
            cost = cost_of(limit, tokens)
            if sum(buckets.values()) + cost > limit.limit:
                return Rejection(limit, retry_after(limit, buckets, now, cost), cost)
            plan.append((name, buckets, current, cost, limit.unit))
        reservation = Reservation(at=now)
        for name, buckets, current, cost, unit in plan:
            buckets[current] = buckets.get(current, 0) + cost
            if unit == "tokens":
                reservation.tokens.append((name, current))
        return reservation

    async def settle(self, reservation: Reservation, token_delta: int) -> None:
        for name, bucket in reservation.tokens:
            buckets = self.counters.get(name)
            if buckets is not None and bucket in buckets:
                buckets[bucket] += token_delta

    async def close(self) -> None:
        return None


# ARGV: per key (bucket_s, buckets, cost, limit, ttl_s). Returns {0, now, bucket of each key} when admitted,
# {i, now, bucket, count, ...} (the live buckets of the i-th key) when its limit refuses
ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = #KEYS
local current = {}
for i = 1, n do
  local a = (i - 1) * 5
  local size, count = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cost, limit = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local k = math.floor(now / size)
  current[i] = k
  local fields = redis.call('HGETALL', KEYS[i])
  local total, live = 0, {}
  for j = 1, #fields, 2 do
    local b = tonumber(fields[j])
    if b < k - count then redis.call('HDEL', KEYS[i], fields[j])
    else total = total + tonumber(fields[j + 1]); live[#live + 1] = fields[j]; live[#live + 1] = fields[j + 1] end
  end
  if total + cost > limit then
    local out = {i, tostring(now)}
    for j = 1, #live do out[#out + 1] = live[j] end
    return out
  end
end
for i = 1, n do
  local a = (i - 1) * 5
  redis.call('HINCRBY', KEYS[i], current[i], ARGV[a + 3])
  redis.call('EXPIRE', KEYS[i], ARGV[a + 5])
end
local out = {0, tostring(now)}
for i = 1, n do out[#out + 1] = current[i] end
return out
"""
# KEYS: counters; ARGV: delta, then one bucket per key. Only buckets still alive are settled.
SETTLE_LUA = """
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[i + 1]) == 1 then redis.call('HINCRBY', KEYS[i], ARGV[i + 1], ARGV[1]) end
end
return 0
"""


class RedisLimiter:
    """Buckets in Redis shared by every gateway replica and worker. Every call is bounded by
    `timeout_s` (to connect, and for each reply); a failure raises LimiterUnavailable."""

    suspends = True  # each call waits for Redis, which runs the script whether or not the caller is there

    def __init__(self, url: str, prefix: str = "mlplane:gateway", timeout_s: float = 0.5):
        self.prefix = prefix
        self.redis = RespClient(url, timeout_s)
        self.acquire_script, self.settle_script = LuaScript(ACQUIRE_LUA), LuaScript(SETTLE_LUA)

    async def _call(self, script: LuaScript, keys: list[str], args: list):
        try:
            return await self.redis.run_script(script, keys, args)
        except (RedisUnavailable, RedisReplyError) as error:
            raise LimiterUnavailable(f"rate-limit store unreachable: {error}") from error

    async def acquire(self, limits: list[Limit], tokens: int) -> Reservation | Rejection:
        if not limits:
            return Reservation(at=time.time())
        names = [f"{self.prefix}:{limit.scope}:{limit.unit}:{limit.period}" for limit in limits]
        args = []
        for limit in limits:
            seconds, _ = PERIODS[limit.period]
            args += [
                limit.bucket_s,
                limit.buckets,
                cost_of(limit, tokens),
                limit.limit,
                int(seconds + limit.bucket_s) + 1,
            ]
        answer = await self._call(self.acquire_script, names, args)
        violated, now = int(answer[0]), float(answer[1])
        if violated:
            limit = limits[violated - 1]
            pairs = answer[2:]
            live = {int(pairs[i]): int(pairs[i + 1]) for i in range(0, len(pairs), 2)}
            cost = cost_of(limit, tokens)
            return Rejection(limit, retry_after(limit, live, now, cost), cost)
        buckets = [int(b) for b in answer[2:]]
        return Reservation(
            [(name, bucket) for name, bucket, limit in zip(names, buckets, limits) if limit.unit == "tokens"], at=now
        )

    async def settle(self, reservation: Reservation, token_delta: int) -> None:
        if token_delta and reservation.tokens:
            await self._call(
                self.settle_script,
                [name for name, _ in reservation.tokens],
                [token_delta, *(bucket for _, bucket in reservation.tokens)],
            )

    async def close(self) -> None:
        await self.redis.aclose()


def limiter_for(setting: str, prefix: str, timeout_s: float = 0.5):
    if setting == "memory":
        return MemoryLimiter(prefix)
    if setting.startswith(("redis://", "rediss://", "unix://")):
        return RedisLimiter(setting, prefix, timeout_s)
    raise ValueError(f"settings.rate_limits must be 'memory' or a redis:// URL, not {setting!r}")
