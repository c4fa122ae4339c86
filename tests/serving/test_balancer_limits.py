"""The balancer's choices, the in-process limiter's arithmetic and config errors, without servers."""

import asyncio
import random

import pytest

from serving.gateway.balancer import BackendState, choose
from serving.gateway.config import BackendSpec, ConfigError, parse_config
from serving.gateway.limits import Limit, MemoryLimiter, Rejection, Reservation, limits_for
from serving.gateway.store import ApiKey, Team


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def backend(
    url: str, region: str, latency: float | None = None, capacity: int = 4, weight: float = 1.0, clock=None
) -> BackendState:
    state = BackendState(
        BackendSpec(model_name="m", url=url, model="m", region=region, capacity=capacity, weight=weight)
    )
    state.latency_s = latency
    if clock:
        state.clock = clock
    return state


def test_prefers_the_callers_region_until_it_is_much_slower():
    eu, us = backend("http://eu", "eu", 0.10), backend("http://us", "us", 0.08)
    assert choose([eu, us], "eu", set(), spill_factor=2.0) is eu
    assert choose([eu, us], "us", set(), spill_factor=2.0) is us
    eu.latency_s = 0.5  # more than twice the other region's cost: spill over
    assert choose([eu, us], "eu", set(), spill_factor=2.0) is us


def test_load_moves_traffic_and_full_backends_are_skipped():
    a, b = backend("http://a", "eu", 0.1, capacity=4), backend("http://b", "eu", 0.1, capacity=4)
    for _ in range(2):
        a.start()
    assert choose([a, b], "eu", set(), 2.0) is b  # same latency, fewer in flight
    for _ in range(2):
        a.start()
    b.latency_s = 100.0
    assert choose([a, b], "eu", set(), 2.0) is b  # a is at capacity, so only b is left
    assert choose([a, b], "eu", {"m@http://b#m"}, 2.0) is None


def test_weights_split_ties():
    a, b = backend("http://a", "eu", 0.1, weight=3.0), backend("http://b", "eu", 0.3, weight=1.0)
    rng = random.Random(1)
    picks = [choose([a, b], None, set(), 2.0, rng).spec.url for _ in range(400)]
    # a costs 0.1/3, b 0.3/1: the cheaper a always wins
    assert picks.count("http://a") == 400
    b.latency_s = 0.1
    b.spec = BackendSpec(model_name="m", url="http://b", model="m", region="eu", weight=3.0)
    picks = [choose([a, b], None, set(), 2.0, rng).spec.url for _ in range(400)]
    assert 120 < picks.count("http://a") < 280


def test_circuit_opens_after_consecutive_failures_and_half_opens_for_one_trial():
    clock = Clock()
    state = backend("http://a", "eu", 0.1, clock=clock)
    for _ in range(3):
        state.start()
        state.finish(False, None, None, failures_to_open=3, open_s=10)
    assert state.circuit() == "open" and not state.available()
    clock.now += 11
    assert state.circuit() == "half_open" and state.available()
    state.start()
    assert not state.available()  # one trial at a time
    state.finish(False, None, None, 3, 10)
    assert state.circuit() == "open"  # the trial failed: open again at once
    clock.now += 11
    state.start()
    state.finish(True, 0.2, None, 3, 10)
    assert state.circuit() == "closed" and state.available()
    assert 0.1 < state.latency_s < 0.2  # moving average


def fail(state: BackendState, key_id: str) -> None:
    state.start()
    state.finish(False, None, None, failures_to_open=3, open_s=10, key_id=key_id, key_budget=1)


def test_one_keys_failures_open_its_own_circuit_not_the_shared_one():
    clock = Clock()
    state = backend("http://a", "eu", 0.1, clock=clock)
    for _ in range(5):
        fail(state, "hostile")
    assert state.circuit() == "closed" and state.available("someone-else")
    assert not state.available("hostile")  # three in a row: its own circuit
    clock.now += 11
    assert state.available("hostile")  # it may try again after open_s
    fail(state, "hostile")
    assert not state.available("hostile")  # and is shut out again at once on a failure


def test_failures_of_distinct_keys_open_the_shared_circuit_and_a_success_resets_a_key():
    state = backend("http://a", "eu", 0.1, clock=Clock())
    fail(state, "a")
    fail(state, "b")
    state.start()
    state.finish(True, 0.1, None, 3, 10, key_id="c")  # the backend answers: the shared count restarts
    fail(state, "d")
    fail(state, "e")
    assert state.circuit() == "closed"
    fail(state, "f")  # an outage every key sees
    assert state.circuit() == "open" and not state.available("g")
    state.start()
    state.finish(True, 0.1, None, 3, 10, key_id="a")
    assert "a" not in state.key_failures and state.key_failures["b"] == 1  # each key's own count


def key(**limits) -> ApiKey:
    return ApiKey(key_id="k1", owner="o", team="t", **limits)


def test_limits_of_a_key_and_its_team():
    limits = limits_for(key(tpm=100, rpd=5), Team("t", tpm=1000))
    assert Limit("key:k1", "tokens", "minute", 100) in limits
    assert Limit("key:k1", "requests", "day", 5) in limits
    assert Limit("team:t", "tokens", "minute", 1000) in limits
    assert len(limits) == 3


def test_reservations_hold_the_token_limit_and_settle_to_actual_use():
    clock = Clock(60 * 1000 + 10)
    limiter = MemoryLimiter("test", clock=clock)
    limits = limits_for(key(tpm=100, rpm=10))

    async def scenario():
        first = await limiter.acquire(limits, 60)
        assert isinstance(first, Reservation)
        second = await limiter.acquire(limits, 60)
        assert isinstance(second, Rejection) and second.limit.unit == "tokens"
        assert second.retry_after_s == 61  # until its one-second bucket leaves the sliding minute
        await limiter.settle(first, -40)  # the request used 20 of its 60
        assert isinstance(await limiter.acquire(limits, 60), Reservation)
        too_big = await limiter.acquire(limits, 500)
        assert isinstance(too_big, Rejection) and "more than the limit" in too_big.message()
        clock.now += 61  # its bucket has left the window
        assert isinstance(await limiter.acquire(limits, 100), Reservation)

    asyncio.run(scenario())


def test_a_rejection_increments_nothing():
    limiter = MemoryLimiter("test", clock=Clock())
    limits = limits_for(key(rpm=1), Team("t", tpm=10))

    async def scenario():
        assert isinstance(await limiter.acquire(limits, 20), Rejection)  # over the team's tokens
        assert isinstance(await limiter.acquire(limits, 5), Reservation)  # the request count was not taken
        assert isinstance(await limiter.acquire(limits, 1), Rejection)

    asyncio.run(scenario())


def test_gateway_config_errors_name_the_problem():
    good = {"model_list": [{"model_name": "m", "url": "http://x"}], "settings": {}}
    assert parse_config(good).backends[0].model_name == "m"
    with pytest.raises(ConfigError, match=r"model_list\[0\]\.urll: Extra inputs are not permitted"):
        parse_config({**good, "model_list": [{"model_name": "m", "url": "http://x", "urll": "http://x"}]})
    with pytest.raises(ConfigError, match=r"settings\.stroe: Extra inputs"):
        parse_config({**good, "settings": {"stroe": "x"}})
    with pytest.raises(ConfigError, match=r"settings\.max_attempts: Input should be a valid integer"):
        parse_config({**good, "settings": {"max_attempts": "3"}})
    with pytest.raises(ConfigError, match=r"model_list\[0\]\.capacity"):
        parse_config({**good, "model_list": [{"model_name": "m", "url": "http://x", "capacity": 0}]})
