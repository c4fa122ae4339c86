"""The rate limiter's Redis client (serving/gateway/resp.py) against the real Redis: scripts survive a
SCRIPT FLUSH, the URL's database is selected, a caller that gives up does not shift later replies, and a
Redis that stops answering fails within the timeout and is reconnected afterwards."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid

import pytest

from serving.gateway.resp import LuaScript, RedisReplyError, RedisUnavailable, RespClient
from tests.services import REDIS, redis_client

pytestmark = pytest.mark.services  # Redis

ECHO = LuaScript("return {KEYS[1], ARGV[1]}")


def test_scripts_run_after_a_script_flush_and_the_urls_database_is_used():
    key = f"mlplane:test:resp:{uuid.uuid4().hex}"

    async def run():
        client = RespClient(f"redis://{REDIS}/3", timeout_s=1)
        try:
            assert await client.run_script(ECHO, [key], [42]) == [key.encode(), b"42"]
            await client.execute("SCRIPT", "FLUSH")
            assert await client.run_script(ECHO, [key], [43]) == [key.encode(), b"43"]  # EVAL, then cached
            await client.execute("SET", key, "in-db-3")
            with pytest.raises(RedisReplyError, match="ERR"):
                await client.execute("NOSUCHCOMMAND")
            assert await client.execute("GET", key) == b"in-db-3"  # the error did not shift the replies
        finally:
            await client.execute("DEL", key)
            await client.aclose()

    asyncio.run(run())
    assert redis_client().get(key) is None  # database 0 never saw it


def test_a_caller_that_gives_up_does_not_shift_the_replies_of_the_others():
    key = f"mlplane:test:resp:{uuid.uuid4().hex}"

    async def run():
        client = RespClient(f"redis://{REDIS}/0", timeout_s=2)
        try:
            await client.execute("SET", key, "v")
            abandoned = asyncio.create_task(client.execute("EVAL", "return redis.call('TIME')", 0))
            await asyncio.sleep(0)  # sent, its reply not yet read
            abandoned.cancel()
            answers = await asyncio.gather(*(client.execute("ECHO", f"n{i}") for i in range(50)))
            assert answers == [f"n{i}".encode() for i in range(50)]
            assert await client.execute("GET", key) == b"v"
        finally:
            await client.execute("DEL", key)
            await client.aclose()

    asyncio.run(run())


def test_a_silent_redis_fails_within_the_timeout_and_the_next_call_reconnects():
    """A server that accepts and never answers (a fake network fault), then one that answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()

    async def run():
        client = RespClient(f"redis://127.0.0.1:{port}/0", timeout_s=0.3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        calls = [client.execute("PING") for _ in range(3)]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(o, RedisUnavailable) for o in outcomes), outcomes
        assert loop.time() - started < 2
        client.host, client.port = REDIS.split(":")[0], int(REDIS.split(":")[1])  # Redis is back
        assert await client.execute("PING") == b"PONG"
        await client.aclose()

    try:
        asyncio.run(run())
    finally:
        listener.close()
        for connection in held:
            connection.close()


def test_a_refused_connection_and_a_wrong_password_are_errors_not_hangs():
    async def run():
        with pytest.raises(RedisUnavailable):
            await RespClient("redis://127.0.0.1:1/0", timeout_s=0.3).execute("PING")
        with pytest.raises(RedisReplyError, match="AUTH"):
            await RespClient(f"redis://:wrong-password@{REDIS}/0", timeout_s=1).execute("PING")

    asyncio.run(run())
