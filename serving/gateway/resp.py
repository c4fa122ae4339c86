"""A lean Redis client for the rate limiter: one pipelined connection, one write per command, replies
parsed by hiredis (the parser redis-py itself uses). The limiter makes two script calls a request;
through redis-py's asyncio client those cost about a third of a millisecond of CPU each request
(`benchmarks/gateway.py --redis-limits`), mostly its connection pool and command machinery. This does
what the limiter needs and no more: EVALSHA falling back to EVAL, AUTH and SELECT from the URL, TLS,
unix sockets, timeouts.

Any failure (refused, reset, no reply within `timeout_s`) closes the connection and fails every command
in flight on it with `RedisUnavailable`; the next command opens a new connection. Replies come back in
the order the commands went out, so a command whose caller gave up still takes its reply off the line."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis


class RedisUnavailable(ConnectionError):
    """Redis could not be reached, broke the connection or did not answer within the timeout."""


class RedisReplyError(RuntimeError):
    """Redis answered with an error (a script error, a wrong password, ...)."""


class LuaScript:
    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class _Connection(asyncio.Protocol):
    def __init__(self):
        self.reader = hiredis.Reader()
        self.pending: deque[asyncio.Future] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if not self.pending:  # a reply nobody asked for: the stream is out of step
                self.abort("Redis sent a reply to no command")
                return
            future = self.pending.popleft()
            if not future.done():  # its caller may have been cancelled
                future.set_result(reply)

    def connection_lost(self, error) -> None:
        self.closed = True
        self._fail_pending(f"Redis closed the connection ({error or 'end of stream'})")

    def send(self, loop: asyncio.AbstractEventLoop, args: tuple) -> asyncio.Future:
        future = loop.create_future()
        self.pending.append(future)
        self.transport.write(hiredis.pack_command(args))
        return future

    def abort(self, reason: str) -> None:
        self.closed = True
        self._fail_pending(reason)
        if self.transport is not None:
            self.transport.abort()

    def _fail_pending(self, reason: str) -> None:
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(RedisUnavailable(reason))  # one exception per waiting caller


class RespClient:
    """redis://[[user]:password@]host[:port][/db], rediss://... (TLS) or unix:///path[?db=N]."""

    def __init__(self, url: str, timeout_s: float):
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a Redis URL: {url!r}")
        self.scheme, self.timeout_s = parts.scheme, timeout_s
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port or 6379, unquote(parts.path)
        query = parse_qs(parts.query)
        db = query.get("db", [None])[0] if parts.scheme == "unix" else parts.path.strip("/") or None
        self.setup: list[tuple] = []
        if parts.password is not None:
            user = unquote(parts.username) if parts.username else None
            self.setup.append(("AUTH", user, unquote(parts.password)) if user else ("AUTH", unquote(parts.password)))
        if db not in (None, "", "0"):
            self.setup.append(("SELECT", int(db)))
        self.connection: _Connection | None = None
        self.connecting = asyncio.Lock()

    async def execute(self, *args):
        """One command's reply; RedisReplyError for an error reply, RedisUnavailable for the rest."""
        connection = await self._connected()
        reply = await self._reply(connection, connection.send(asyncio.get_running_loop(), args))
        if isinstance(reply, hiredis.ReplyError):
            raise RedisReplyError(str(reply))
        return reply

    async def run_script(self, script: LuaScript, keys: list[str], args: list):
        """EVALSHA, and EVAL when Redis does not have the script (a restart or SCRIPT FLUSH)."""
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except RedisReplyError as error:
            if not str(error).startswith("NOSCRIPT"):
                raise
            return await self.execute("EVAL", script.source, len(keys), *keys, *args)

    async def aclose(self) -> None:
        if self.connection is not None and not self.connection.closed:
            self.connection.transport.close()
        self.connection = None

    async def _reply(self, connection: _Connection, future: asyncio.Future):
        try:
            async with asyncio.timeout(self.timeout_s):
                return await future
        except TimeoutError:
            reason = f"no reply from Redis within {self.timeout_s:g} s"
            connection.abort(reason)  # the line is out of step now: every command on it fails
            raise RedisUnavailable(reason) from None

    async def _connected(self) -> _Connection:
        connection = self.connection
        if connection is not None and not connection.closed:
            return connection
        async with self.connecting:
            if self.connection is not None and not self.connection.closed:
                return self.connection
            self.connection = await self._connect()
            return self.connection

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout_s):
                if self.scheme == "unix":
                    _, connection = await loop.create_unix_connection(_Connection, self.path)
                else:
                    tls = ssl.create_default_context() if self.scheme == "rediss" else None
                    _, connection = await loop.create_connection(_Connection, self.host, self.port, ssl=tls)
        except TimeoutError:
            raise RedisUnavailable(f"connecting to Redis took more than {self.timeout_s:g} s") from None
        except OSError as error:
            raise RedisUnavailable(f"cannot connect to Redis: {error}") from error
        for command in self.setup:
            reply = await self._reply(connection, connection.send(loop, command))
            if isinstance(reply, hiredis.ReplyError):
                connection.abort("setup failed")
                raise RedisReplyError(f"{command[0]} failed: {reply}")
        return connection
