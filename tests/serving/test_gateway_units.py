"""The gateway's parts without backends: sliding-window limits (in memory and on the real Redis) checked
against an independent recount of every window, the strict JSON reader, the request models, what a
request reserves, and the SSE relay (an Exchange's bookkeeping: test_gateway_exchange.py)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.gateway import limits as limits_module
from serving.gateway.config import ConfigError, parse_config
from serving.gateway.errors import GatewayError, parse_json
from serving.gateway.limits import Limit, MemoryLimiter, RedisLimiter, Rejection, Reservation
from serving.gateway.routes.openai import completion_cap
from serving.gateway.schemas import ChatCompletionRequest, CompletionRequest, KeyCreate
from serving.gateway.service import ModelGroup
from serving.gateway.sse import StreamTally, relay
from serving.gateway.tokens import TokenCounter
from tests.services import REDIS, redis_client


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def worst_window(admitted: list[tuple[float, int]], period: float) -> int:
    """The most admitted in any half-open window [t, t + period), recounted from the raw log."""
    return max((sum(c for u, c in admitted if t <= u < t + period) for t, _ in admitted), default=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 200), st.integers(1, 40)), min_size=1, max_size=60))
def test_memory_limit_holds_in_every_sliding_minute(arrivals):
    """Never more than the limit in ANY 60-s window (a fixed window admits 2x across its boundary), and a
    refusal only when the last 61 s (the window plus one bucket) are full."""
    limit = 100
    clock = Clock(1_000_000.0)
    limiter = MemoryLimiter("t", clock=clock)
    rule = [Limit("key:k", "tokens", "minute", limit)]
    admitted: list[tuple[float, int]] = []

    async def run():
        for offset, cost in sorted(arrivals):
            clock.now = 1_000_000.0 + offset
            outcome = await limiter.acquire(rule, cost)
            if isinstance(outcome, Reservation):
                admitted.append((clock.now, cost))
            else:
                recent = sum(c for u, c in admitted if u > clock.now - 62)
                assert recent + cost > limit
                assert outcome.retry_after_s >= 1

    asyncio.run(run())
    assert worst_window(admitted, 60) <= limit


def test_fixed_window_boundary_burst_is_refused():
    clock = Clock(60 * 1000 + 59.5)  # half a second before a minute boundary
    limiter = MemoryLimiter("t", clock=clock)
    rule = [Limit("key:k", "requests", "minute", 10)]

    async def run():
        assert all([isinstance(await limiter.acquire(rule, 0), Reservation) for _ in range(10)])
        clock.now += 1  # the next fixed minute: a fixed window would admit 10 more here
        refused = await limiter.acquire(rule, 0)
        assert isinstance(refused, Rejection) and refused.retry_after_s == 60
        clock.now += 60
        assert isinstance(await limiter.acquire(rule, 0), Reservation)

    asyncio.run(run())


def test_day_window_is_sliding_too():
    clock = Clock(86_400 * 100 + 86_000)
    limiter = MemoryLimiter("t", clock=clock)
    rule = [Limit("key:k", "tokens", "day", 1000)]

    async def run():
        assert isinstance(await limiter.acquire(rule, 900), Reservation)
        clock.now += 1000  # past midnight
        assert isinstance(await limiter.acquire(rule, 200), Rejection)

    asyncio.run(run())


@pytest.mark.services  # Redis
def test_redis_limit_holds_in_every_sliding_window(monkeypatch):
    """The Lua script on the real Redis, with the minute shrunk to 2 s in 4 buckets so a run takes
    seconds; admission times are Redis' own clock."""
    monkeypatch.setitem(limits_module.PERIODS, "minute", (2, 4))
    prefix = f"mlplane:test:{uuid.uuid4().hex[:8]}"
    limiter = RedisLimiter(f"redis://{REDIS}/0", prefix)
    rule = [Limit("key:k", "tokens", "minute", 50)]
    admitted: list[tuple[float, int]] = []
    rng = __import__("random").Random(7)

    async def run():
        loop = asyncio.get_running_loop()
        stop = loop.time() + 4.5
        while loop.time() < stop:
            cost = rng.randint(1, 12)
            outcome = await limiter.acquire(rule, cost)
            if isinstance(outcome, Reservation):
                admitted.append((outcome.at, cost))
                if rng.random() < 0.3:  # settle some to less than reserved
                    refund = cost // 2
                    await limiter.settle(outcome, -refund)
                    admitted[-1] = (outcome.at, cost - refund)
            await asyncio.sleep(rng.random() * 0.05)
        await limiter.close()

    try:
        asyncio.run(run())
    finally:
        redis = redis_client()
        counted = sum(int(v) for v in redis.hgetall(f"{prefix}:key:k:tokens:minute").values())
        for key in redis.scan_iter(f"{prefix}:*"):
            redis.delete(key)
    assert len(admitted) > 5
    assert worst_window(admitted, 2) <= 50
    alive = max(at for at, _ in admitted) - 2.5  # the buckets still in the hash
    assert counted == sum(c for at, c in admitted if at > alive) or counted <= sum(c for _, c in admitted)


def test_redis_down_raises_limiter_unavailable_quickly():
    from serving.gateway.limits import LimiterUnavailable

    limiter = RedisLimiter("redis://127.0.0.1:1/0", "x", timeout_s=0.2)

    async def run():
        started = asyncio.get_running_loop().time()
        with pytest.raises(LimiterUnavailable):
            await limiter.acquire([Limit("key:k", "requests", "minute", 1)], 0)
        assert asyncio.get_running_loop().time() - started < 5  # bounded, not a hang
        await limiter.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    "raw, problem",
    [
        (b'{"model": "m", "temperature": NaN}', "NaN is not valid JSON"),
        (b'{"model": "m", "temperature": Infinity}', "Infinity is not valid JSON"),
        (b'{"model": "m", "temperature": 1e999}', "out of range"),
        (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, "nested more than"),
        (b'{"a": ' * 40 + b"1" + b"}" * 40, "nested more than 32"),
        (b'{"model": "m", "prompt": "\\ud800"}', "lone UTF-16 surrogate"),
        (b'{"\\udfff": 1}', "lone UTF-16 surrogate"),
        (b"[1]", "JSON object"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_strict_json_refuses_what_backends_cannot_take(raw, problem):
    with pytest.raises(GatewayError) as error:
        parse_json(raw, max_depth=32)
    assert error.value.status == 400 and problem in error.value.message


def test_strict_json_keeps_valid_surrogate_pairs():
    assert parse_json(b'{"prompt": "\\ud83d\\ude00"}', 32) == {"prompt": "\U0001f600"}


@pytest.mark.parametrize(
    "body, field",
    [
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": [1]}, "stream_options"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "8"}, "max_tokens"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ],
)
def test_chat_request_model_names_the_bad_field(body, field):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as error:
        ChatCompletionRequest.model_validate(body)
    assert error.value.errors()[0]["loc"][0] == field


def test_key_payload_is_typed():
    from pydantic import ValidationError

    for bad, field in (
        ({"rpm": "abc"}, "rpm"),
        ({"models": "gateway-llm"}, "models"),
        ({"tpm": 0}, "tpm"),
        ({"team_tpm": 5}, "team_tpm"),
    ):
        with pytest.raises(ValidationError) as error:
            KeyCreate.model_validate({"owner": "o", "team": "t", **bad})
        assert error.value.errors()[0]["loc"][0] == field


def test_reload_settings_are_typed():
    with pytest.raises(ConfigError, match=r"settings\.max_attempts"):
        parse_config({"model_list": [{"model_name": "m", "url": "http://x"}], "settings": {"max_attempts": "3"}})


GROUP = ModelGroup("m", [], TokenCounter(None), max_tokens=32, kind="openai")


@pytest.mark.parametrize(
    "endpoint, body, reserved, sent",
    [
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, 32, {"max_tokens": 32}),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "n": 60, "max_tokens": 16}, 960, {}),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100, "max_completion_tokens": 5},
            100,
            {},
        ),
        ("completions", {"prompt": ["a"] * 64, "max_tokens": 16}, 1024, {}),
        ("completions", {"prompt": [[1, 2], [3]], "n": 2, "best_of": 3, "max_tokens": 4}, 24, {}),
        ("completions", {"prompt": [1, 2, 3]}, 32, {"max_tokens": 32}),
        # vLLM's completions honour max_tokens only: a small max_completion_tokens must not shrink the reservation
        ("completions", {"prompt": "a", "max_completion_tokens": 1}, 32, {"max_tokens": 32}),
        ("completions", {"prompt": "a", "max_tokens": 200, "max_completion_tokens": 1}, 200, {}),
    ],
)
def test_a_request_reserves_every_choice_of_every_prompt(endpoint, body, reserved, sent):
    body = {"model": "m", **body}
    schema = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
    spec = schema.model_validate(body)
    before = dict(body)
    assert completion_cap(GROUP, endpoint, spec, body) == reserved
    assert body == {**before, **sent}


def lines(*items: str):
    async def iterate():
        for item in items:
            yield item

    return iterate()


def event(**fields) -> str:
    return "data: " + json.dumps(fields)


async def collect(first: str, rest, tally: StreamTally, pass_usage: bool) -> list[str]:
    return [chunk async for chunk in relay(first, rest, tally, "public", pass_usage)]


def test_relay_renames_the_model_and_tallies_the_usage():
    backend = [
        event(model="internal", choices=[{"delta": {"content": "a"}}]),
        "",
        event(model="internal", choices=[{"delta": {"content": "b"}}]),
        "",
        event(model="internal", choices=[], usage={"prompt_tokens": 7, "completion_tokens": 2}),
        "",
        "data: [DONE]",
        "",
    ]
    tally = StreamTally(prompt_tokens=5)
    out = asyncio.run(collect(backend[0], lines(*backend[1:]), tally, pass_usage=False))
    events = [json.loads(c[6:]) for c in out if c.startswith("data: {")]
    assert [e["model"] for e in events] == ["public", "public"]  # the usage chunk is dropped
    assert out[-2] == "data: [DONE]\n" and all(c.endswith("\n") for c in out)
    assert (tally.prompt_tokens, tally.completion, tally.finished) == (7, 2, True)
    tally = StreamTally(prompt_tokens=5)
    out = asyncio.run(collect(backend[0], lines(*backend[1:]), tally, pass_usage=True))
    assert sum(1 for c in out if '"usage"' in c) == 1


def test_relay_counts_chunks_without_usage_and_passes_errors_on():
    async def failing():
        yield event(model="internal", choices=[{"delta": {"content": "b"}}])
        raise ConnectionResetError("backend gone")

    tally = StreamTally(prompt_tokens=3)
    received = []

    async def run():
        async for chunk in relay(event(choices=[{"delta": {}}]), failing(), tally, "public", False):
            received.append(chunk)

    with pytest.raises(ConnectionResetError):
        asyncio.run(run())
    assert len(received) == 2 and tally.completion == 2 and not tally.finished


def test_relay_passes_lines_it_cannot_read():
    tally = StreamTally(prompt_tokens=0)
    out = asyncio.run(collect(": keep-alive", lines("data: {not json", 'data: "x"'), tally, False))
    assert out == [": keep-alive\n", "data: {not json\n", 'data: "x"\n'] and tally.finished
