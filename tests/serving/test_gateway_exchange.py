"""An Exchange, the gateway's per-request bookkeeping, driven by hand on a Gateway that does not
serve: it reserves, frees its backend slot, settles and writes one usage record exactly once on every
path (answer, bug, cancellation), with limits in memory and in the real Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import yaml

from serving.gateway.exchange import Exchange
from serving.gateway.service import Caller, Gateway
from serving.gateway.store import ApiKey
from tests.services import REDIS, redis_client


def gateway_over(tmp_path, **settings) -> Gateway:
    """A Gateway over a SQLite store in front of a backend that is never called."""
    config = tmp_path / "gateway.yaml"
    settings = {"store": f"sqlite:///{tmp_path}/g.db", **settings}
    backends = [{"model_name": "m", "url": "http://127.0.0.1:9"}]
    config.write_text(yaml.safe_dump({"model_list": backends, "settings": settings}))
    return Gateway(config)


@pytest.fixture
def bare_gateway(tmp_path):
    gateway = gateway_over(tmp_path)
    yield gateway
    gateway.store.close()


def queued(gateway) -> list[dict]:
    records = []
    while not gateway.usage.queue.empty():
        records.append(gateway.usage.queue.get_nowait())
    return records


def test_an_exchange_settles_and_records_exactly_once_on_every_path(bare_gateway):
    gateway = bare_gateway
    caller = Caller(ApiKey(key_id="k", owner="o", team="t", tpm=100), None)
    state = gateway.router.groups["m"].backends[0]
    tokens = ("mlplane:gateway:key:k:tokens:minute",)

    def held() -> int:
        return sum(gateway.limiter.counters.get(tokens[0], {}).values())

    async def normal():
        async with Exchange(gateway, caller, "chat", "m") as exchange:
            await exchange.admit(60)
            exchange.take(state)
            exchange.release(True, 0.01)
            await exchange.finish(200, 10, 5)
            await exchange.finish(200, 10, 5)  # a second close does nothing

    async def failing():
        async with Exchange(gateway, caller, "chat", "m") as exchange:
            await exchange.admit(60)
            exchange.take(state)
            raise RuntimeError("a bug inside the gateway")

    async def cancelled():
        async def handler():
            async with Exchange(gateway, caller, "chat", "m") as exchange:
                await exchange.admit(60)
                exchange.take(state)
                await asyncio.sleep(3600)  # at the backend when the client goes away

        task = asyncio.create_task(handler())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(normal())
    assert held() == 15 and state.in_flight == 0
    assert [(r["status"], r["prompt_tokens"], r["completion_tokens"]) for r in queued(gateway)] == [(200, 10, 5)]
    with pytest.raises(RuntimeError):
        asyncio.run(failing())
    asyncio.run(cancelled())
    assert [r["status"] for r in queued(gateway)] == [500, 499]
    assert held() == 15 and state.in_flight == 0  # both reservations settled to nothing, both slots freed
    assert state.consecutive_failures == 0  # neither counted against the backend


@pytest.mark.services  # Redis
def test_a_request_cancelled_while_redis_admits_or_settles_it_loses_nothing(tmp_path):
    """Redis runs a script whether or not its caller waits for the reply, and asyncio's own
    Task.cancel() (uvicorn's on shutdown) passes anyio's shields: a request cancelled between sending
    the acquisition and reading its answer still gives back what Redis reserved, and one cancelled
    while it settles still writes its usage record and settles."""
    from serving.gateway import exchange as exchange_module

    prefix = f"mlplane:test:{uuid.uuid4().hex[:8]}"
    gateway = gateway_over(tmp_path, rate_limits=f"redis://{REDIS}/0", rate_limit_prefix=prefix)
    caller = Caller(ApiKey(key_id="k", owner="o", team="t", tpm=1000), None)

    async def cancel_once_sent(task: asyncio.Task) -> None:
        await asyncio.sleep(0)  # the handler has sent its script; the reply is not read yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5):
            while exchange_module._outliving:  # what Redis ran for the cancelled handler
                await asyncio.sleep(0.01)

    async def run():
        await gateway.limiter.redis.execute("PING")  # connected, so a script goes out at once

        async def admitting():
            async with Exchange(gateway, caller, "chat", "m") as exchange:
                await exchange.admit(60)

        await cancel_once_sent(asyncio.create_task(admitting()))
        settling_may_start = asyncio.Event()

        async def settling():
            async with Exchange(gateway, caller, "chat", "m") as exchange:
                await exchange.admit(60)
                await settling_may_start.wait()
                await exchange.finish(200, 10, 5)

        task = asyncio.create_task(settling())
        await asyncio.sleep(0.2)  # admitted
        settling_may_start.set()
        await cancel_once_sent(task)
        await gateway.limiter.close()

    try:
        asyncio.run(run())
        held = sum(int(v) for v in redis_client().hgetall(f"{prefix}:key:k:tokens:minute").values())
    finally:
        gateway.store.close()
        for key in redis_client().scan_iter(f"{prefix}:*"):
            redis_client().delete(key)
    assert [(r["status"], r["completion_tokens"]) for r in queued(gateway)] == [(499, 0), (200, 5)]
    assert held == 15  # the first gave its 60 back, the second settled to the 15 it used
