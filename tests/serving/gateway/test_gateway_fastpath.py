"""The request path's cheaper parts, without servers: orjson reads and writes exactly what the json
module did (or hands over to it), the usage writer's batches lose nothing and a flush shows every
record at once, limits are worked out once per caller, a lone backend is chosen without scoring and a
response's head and body leave in one write."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.gateway import fastjson, usage
from serving.gateway.balancer import BackendState, choose
from serving.gateway.config import BackendSpec
from serving.gateway.errors import GatewayError, parse_json
from serving.gateway.limits import MemoryLimiter, Reservation
from serving.gateway.protocol import CoalescingTransport
from serving.gateway.service import Caller
from serving.gateway.store import ApiKey, Team

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5), st.booleans())
def test_the_fast_reader_gives_the_json_modules_values(body, ascii_only):
    raw = json.dumps(body, ensure_ascii=ascii_only).encode()
    parsed = parse_json(raw, max_depth=32)
    assert parsed == json.loads(raw)
    assert _types(parsed) == _types(json.loads(raw))  # a 2**70 stays an int, 1.0 a float
    assert json.loads(fastjson.dumps(parsed)) == parsed


@pytest.mark.parametrize("number", [-(2**63) - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(10**19), 10**20])
def test_integers_at_the_edges_of_64_bits_stay_integers(number):
    """orjson reads -2**63 - 1 as a float (hypothesis found it): such a body takes the json module."""
    raw = json.dumps({"seed": number}).encode()
    assert parse_json(raw, max_depth=32) == {"seed": number}
    assert type(parse_json(raw, max_depth=32)["seed"]) is int


def _types(value):
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


@pytest.mark.parametrize(
    "raw, problem",
    [
        (b'{"temperature": NaN}', "NaN is not valid JSON"),
        (b'{"temperature": -Infinity}', "Infinity is not valid JSON"),
        (b'{"temperature": 1e999}', "out of range"),
        (b'{"prompt": "\\udc00 alone"}', "lone UTF-16 surrogate"),
        (b'{"a": ' * 1100 + b"1" + b"}" * 1100, "nested more than 32"),  # past orjson's own limit
        (b"null", "JSON object"),
    ],
)
def test_what_the_fast_reader_refuses_is_named_by_the_strict_one(raw, problem):
    assert fastjson.loads(raw) is None or not isinstance(fastjson.loads(raw), dict)
    with pytest.raises(GatewayError) as error:
        parse_json(raw, max_depth=32)
    assert error.value.status == 400 and problem in error.value.message


def test_backend_answers_keep_the_json_modules_reading():
    assert fastjson.loads_lenient(b'{"x": NaN, "n": 123456789012345678901234567890}') == {
        "x": pytest.approx(float("nan"), nan_ok=True),
        "n": 123456789012345678901234567890,
    }
    with pytest.raises(ValueError):
        fastjson.loads_lenient(b"not json")
    assert fastjson.dumps({"n": 2**70, "s": "é"}) == '{"n":1180591620717411303424,"s":"é"}'.encode()


class SlowStore:
    def __init__(self):
        self.batches: list[list[dict]] = []

    def write_usage(self, records: list[dict]) -> None:
        self.batches.append(list(records))


def test_usage_batches_lose_nothing_and_a_flush_writes_at_once(monkeypatch):
    monkeypatch.setattr(usage, "LINGER_S", 30.0)  # only a flush or the stop can end this linger

    async def scenario():
        store = SlowStore()
        writer = usage.UsageWriter(store)
        writer.start()
        for i in range(3):
            writer.record({"request_id": i})
        await asyncio.wait_for(writer.flush(), 5)
        assert [r["request_id"] for b in store.batches for r in b] == [0, 1, 2]
        await writer.flush()  # nothing queued: returns at once
        writer.record({"request_id": 3})
        writer.record({"request_id": 4})
        await asyncio.wait_for(writer.close(), 5)  # the stop drains the linger's batch
        return [r["request_id"] for b in store.batches for r in b]

    assert asyncio.run(scenario()) == [0, 1, 2, 3, 4]


def test_usage_records_land_after_the_linger_alone(monkeypatch):
    monkeypatch.setattr(usage, "LINGER_S", 0.05)

    async def scenario():
        store = SlowStore()
        writer = usage.UsageWriter(store)
        writer.start()
        writer.record({"request_id": "a"})
        for _ in range(200):
            if store.batches:
                break
            await asyncio.sleep(0.01)
        await writer.close()
        return store.batches

    assert asyncio.run(scenario()) == [[{"request_id": "a"}]]


def test_limits_are_worked_out_once_per_caller_and_pruned_when_the_bucket_moves():
    caller = Caller(ApiKey(key_id="k", owner="o", team="t", tpm=100, rpm=10), Team("t", rpm=5))
    assert caller.limits is caller.limits and len(caller.limits) == 3
    now = [60.0 * 1000]
    limiter = MemoryLimiter("t", clock=lambda: now[0])

    async def scenario():
        assert isinstance(await limiter.acquire(caller.limits, 10), Reservation)
        now[0] += 61  # the first bucket has left the window: the next acquisition drops it
        assert isinstance(await limiter.acquire(caller.limits, 10), Reservation)

    asyncio.run(scenario())
    tokens = limiter.counters["t:key:k:tokens:minute"]
    assert list(tokens) == [int(now[0])] and tokens[int(now[0])] == 10


def test_a_lone_backend_is_chosen_unless_excluded_or_unavailable():
    state = BackendState(BackendSpec(model_name="m", url="http://a", capacity=1))
    assert choose([state], "eu", set(), 2.0) is state
    assert choose([state], None, {state.spec.id}, 2.0) is None
    state.start()  # at capacity
    assert choose([state], None, set(), 2.0) is None


class RecordingTransport:
    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def get_extra_info(self, name: str):
        return f"extra {name}"


def test_a_loop_turns_writes_leave_as_one_in_order_and_close_sends_what_is_held():
    async def scenario():
        loop = asyncio.get_running_loop()
        real = RecordingTransport()
        transport = CoalescingTransport(real, loop)
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"body")
        assert real.writes == [] and transport.get_extra_info("socket") == "extra socket"
        await asyncio.sleep(0)
        assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        transport.write(b"last")
        transport.close()  # nothing held back is lost
        await asyncio.sleep(0)
        assert real.writes[-1] == b"last" and real.closed and len(real.writes) == 2
        dropped = CoalescingTransport(aborted := RecordingTransport(), loop)
        dropped.write(b"never")
        dropped.abort()
        await asyncio.sleep(0)
        assert aborted.writes == [] and aborted.aborted

    asyncio.run(scenario())
