"""A lean HTTP/1.1 client for the gateway's calls to its backends: pooled keep-alive connections, one
`transport.write` per request, responses parsed by httptools (the parser uvicorn uses). It does what
the proxy needs and no more (no redirects, cookies, proxies or decompression: the backend is asked for
identity encoding), and costs about a tenth of aiohttp's client CPU per request (benchmarks/gateway.py).

Timeouts: `connect_timeout_s` to open a connection; `first_byte_timeout_s` from sending a request to the
first byte of its answer (a backend that accepts and never answers is cut there); then `read_timeout_s`
between two reads (a stream may run long, but never stall that long). Errors are `UpstreamError` (a `ConnectionError`);
`UpstreamTimeout` is also a `TimeoutError`. A pooled connection the backend closed just before it was
reused fails before any byte came back: the request is sent once more on a fresh connection."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit

import httptools

STREAM_HIGH_WATER = 256 * 1024  # buffered stream bytes at which reading from the backend pauses


class UpstreamError(ConnectionError):
    """The backend could not be reached, broke the connection or answered something that is not HTTP."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """Connecting took longer than connect_timeout_s, no answer began within first_byte_timeout_s, or
    the backend sent nothing more for read_timeout_s."""


class Origin:
    """scheme://host:port of a backend, and the bytes every request to it starts its headers with."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend URL {url!r} is not http(s)://host[:port]")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self.prefix = parts.path.rstrip("/")
        self.host_header = f"Host: {parts.netloc}\r\nAccept-Encoding: identity\r\n".encode()


class Connection(asyncio.Protocol):
    """One keep-alive connection; one response at a time."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.response: Response | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.last_read = 0.0
        self.received = False  # any byte of the current response

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, error) -> None:
        self.closed = True
        self._cancel_timer()
        response, self.response = self.response, None
        if (
            response is not None
            and response.head.done()
            and response.error is None
            and not {"content-length", "transfer-encoding"} & response.headers.keys()
        ):
            response.finish()  # a body delimited by the end of the connection
        elif response is not None and not response.complete:
            response.fail(
                UpstreamError(f"backend closed the connection ({error or 'end of stream'})"),
                retryable=not self.received,
            )

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        if not self.received and self.timer is not None:  # the answer began: from now on, the read limit
            self.timer.cancel()
            self.timer = self.loop.call_at(self.last_read + self.pool.read_timeout_s, self._check_timeout)
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.abort(UpstreamError(f"backend sent an invalid HTTP response: {error}"))

    def pause_writing(self) -> None:  # a request body larger than the socket buffer: the kernel catches up
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        response = self.response
        if response is not None:
            response.status = self.parser.get_status_code()
            if not response.head.done():
                response.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.feed(body)

    def on_message_complete(self) -> None:
        response, self.response = self.response, None
        self._cancel_timer()
        keep = self.parser.should_keep_alive()
        if response is not None:
            response.finish()
        if not keep:
            self.close()

    # requests
    def send(self, response: Response, payload: bytes) -> None:
        self.response = response
        self.received = False
        self.last_read = self.loop.time()
        self.timer = self.loop.call_at(self.last_read + self.pool.first_byte_timeout_s, self._check_timeout)
        self.transport.write(payload)

    def _check_timeout(self) -> None:
        """Before the answer's first byte the first-byte limit holds, after it the limit between reads."""
        limit = self.pool.read_timeout_s if self.received else self.pool.first_byte_timeout_s
        idle_until = self.last_read + limit
        if self.loop.time() >= idle_until:
            self.timer = None
            what = "sent nothing more" if self.received else "did not begin its answer"
            self.abort(UpstreamTimeout(f"backend {what} within {limit:g} s"))
        else:  # data came since: wait for the rest of the period from the last read
            self.timer = self.loop.call_at(idle_until, self._check_timeout)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def abort(self, error: Exception) -> None:
        response, self.response = self.response, None
        self.close()
        if response is not None:
            response.fail(error)

    def close(self) -> None:
        self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()


class Response:
    """A backend's answer: `status`, `headers` (lower-case names), then the body, read whole (`read`)
    or line by line (`lines`). `close()` hands the connection back when the body was read to its end,
    and drops it otherwise."""

    def __init__(self, pool: Pool, origin: Origin, connection: Connection):
        self.pool, self.origin, self.connection = pool, origin, connection
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head = pool.loop.create_future()
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.error: Exception | None = None
        self.retryable = False
        self.waiter: asyncio.Future | None = None
        self.released = False

    # fed by the connection
    def feed(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > STREAM_HIGH_WATER:
            self.connection.pause_reading()
        self._wake()

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def fail(self, error: Exception, retryable: bool = False) -> None:
        self.error, self.retryable = error, retryable
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: a failure before the head is raised by whoever awaits it
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def _more(self) -> bool:
        """Waits for a body chunk; False at the end of the body."""
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.complete:
                return False
            self.waiter = self.pool.loop.create_future()
            await self.waiter
            self.waiter = None
        return True

    def _take(self) -> bytes:
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.buffered <= STREAM_HIGH_WATER // 4:
            self.connection.resume_reading()
        return chunk

    async def read(self) -> bytes:
        parts = []
        try:
            while await self._more():
                parts.append(self._take())
        finally:  # also when cancelled mid-body: the connection is then dropped, not pooled
            self.close()
        return b"".join(parts)

    async def lines(self):
        """Body lines without their line ends, decoded as UTF-8."""
        pending = b""
        try:
            while await self._more():
                pending += self._take()
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    yield line.decode().rstrip("\r")
            if pending:
                yield pending.decode().rstrip("\r")
        finally:
            self.close()

    def close(self) -> None:
        if self.released:
            return
        self.released = True
        if self.complete and self.error is None and not self.chunks:
            self.pool.put_back(self.origin, self.connection)
        else:
            self.connection.close()


class Pool:
    """Keep-alive connections per backend origin, created on the running loop."""

    def __init__(
        self,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_idle_per_origin: int = 512,
        first_byte_timeout_s: float | None = None,
    ):
        self.loop = asyncio.get_running_loop()
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.first_byte_timeout_s = first_byte_timeout_s or read_timeout_s
        self.max_idle = max_idle_per_origin
        self.origins: dict[str, Origin] = {}
        self.idle: dict[tuple, list[Connection]] = {}
        self.tls: ssl.SSLContext | None = None

    def origin(self, base_url: str) -> Origin:
        origin = self.origins.get(base_url)
        if origin is None:
            origin = self.origins[base_url] = Origin(base_url)
        return origin

    async def request(
        self, method: str, base_url: str, path: str, body: bytes | None, content_type: str = "application/json"
    ) -> Response:
        """Sends a request and returns once the response's status and headers are in."""
        origin = self.origin(base_url)
        head = f"{method} {origin.prefix}{path} HTTP/1.1\r\n".encode() + origin.host_header
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n".encode()
        payload = head + b"\r\n" + (body or b"")
        for reused in (True, False):
            connection = self._idle(origin) if reused else None
            if reused and connection is None:
                continue
            if connection is None:
                connection = await self._connect(origin)
            response = Response(self, origin, connection)
            connection.send(response, payload)
            try:
                await response.head
            except UpstreamError:
                if reused and response.retryable:  # the backend closed it while idle: once more, fresh
                    continue
                raise
            except BaseException:  # cancelled while waiting: the connection is mid-request
                connection.close()
                raise
            return response
        raise AssertionError("unreachable")

    def _idle(self, origin: Origin) -> Connection | None:
        idle = self.idle.get((origin.host, origin.port, origin.tls))
        while idle:
            connection = idle.pop()
            if not connection.closed and not connection.transport.is_closing():
                return connection
        return None

    async def _connect(self, origin: Origin) -> Connection:
        if origin.tls and self.tls is None:
            self.tls = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await self.loop.create_connection(
                    lambda: Connection(self), origin.host, origin.port, ssl=self.tls if origin.tls else None
                )
        except TimeoutError as error:
            raise UpstreamTimeout(f"connecting took more than {self.connect_timeout_s:g} s") from error
        except OSError as error:
            raise UpstreamError(f"cannot connect: {error}") from error
        return connection

    def put_back(self, origin: Origin, connection: Connection) -> None:
        if connection.closed:
            return
        idle = self.idle.setdefault((origin.host, origin.port, origin.tls), [])
        if len(idle) < self.max_idle:
            idle.append(connection)
        else:
            connection.close()

    async def close(self) -> None:
        for idle in self.idle.values():
            for connection in idle:
                connection.close()
        self.idle.clear()
