"""The gateway's HTTP/1.1 client (serving/gateway/http1.py) against a scripted backend: a raw asyncio
server in the test (a stand-in for vLLM's socket, outside the gateway) that answers each request as the
test says, so keep-alive reuse, chunked bodies, stale pooled connections, stalls and early closes are
exercised byte for byte. The gateway over real vLLM backends is tested in test_gateway*.py."""

from __future__ import annotations

import asyncio

import pytest

from serving.gateway.http1 import Pool, UpstreamError, UpstreamTimeout


class Backend:
    """Reads one request at a time and answers with the next scripted reply (bytes, or a coroutine
    function of the writer for stalls and closes). Counts connections and keeps every request seen."""

    def __init__(self, replies: list):
        self.replies = list(replies)
        self.connections = 0
        self.requests: list[bytes] = []
        self.server = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                self.requests.append(head + await reader.readexactly(length))
                reply = self.replies.pop(0)
                if callable(reply):
                    if await reply(writer) is False:
                        return
                else:
                    writer.write(reply)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        self.server.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%b\r\n%b" % (
        len(body),
        extra,
        body,
    )


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_requests_reuse_one_connection_and_send_exact_bytes():
    async def scenario():
        backend = Backend([ok(b'{"a":1}'), ok(b'{"b":2}')])
        url = await backend.start()
        pool = Pool(1.0, 5.0)
        first = await pool.request("POST", url, "/v1/chat/completions", b'{"x":1}')
        assert (first.status, first.headers["content-type"], await first.read()) == (
            200,
            "application/json",
            b'{"a":1}',
        )
        second = await pool.request("GET", url, "/v2/models/m", None)
        assert await second.read() == b'{"b":2}'
        await pool.close()
        await backend.stop()
        return backend

    backend = run(scenario())
    assert backend.connections == 1
    post, get = backend.requests
    assert post.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and post.endswith(b'\r\n\r\n{"x":1}')
    assert b"Content-Length: 7\r\n" in post and b"Content-Type: application/json\r\n" in post
    assert get.startswith(b"GET /v2/models/m HTTP/1.1\r\n") and b"Content-Length" not in get


def test_chunked_stream_is_read_line_by_line_across_chunk_borders():
    events = b'data: {"n":1}\n\ndata: {"n":2}\n\ndata: [DONE]\n\n'
    pieces = [events[:7], events[7:30], events[30:]]
    body = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + body

    async def scenario():
        backend = Backend([reply, ok(b"{}")])
        url = await backend.start()
        pool = Pool(1.0, 5.0)
        response = await pool.request("POST", url, "/v1/chat/completions", b"{}")
        lines = [line async for line in response.lines()]
        again = await pool.request("POST", url, "/v1/chat/completions", b"{}")  # the same connection, reused
        await again.read()
        await backend.stop()
        return lines, backend.connections

    lines, connections = run(scenario())
    assert lines == ['data: {"n":1}', "", 'data: {"n":2}', "", "data: [DONE]", ""]
    assert connections == 1


def test_a_pooled_connection_the_backend_closed_is_replaced_once():
    async def close_without_answer(writer):
        writer.close()
        return False

    async def scenario():
        backend = Backend([ok(b"1"), close_without_answer, ok(b"2")])
        url = await backend.start()
        pool = Pool(1.0, 5.0)
        await (await pool.request("POST", url, "/x", b"{}")).read()
        answer = await (await pool.request("POST", url, "/x", b"{}")).read()
        await backend.stop()
        return answer, backend.connections

    assert run(scenario()) == (b"2", 2)


def test_a_fresh_connection_that_fails_is_an_upstream_error_and_a_refused_one_too():
    async def close_without_answer(writer):
        writer.close()
        return False

    async def scenario():
        backend = Backend([close_without_answer])
        url = await backend.start()
        pool = Pool(1.0, 5.0)
        with pytest.raises(UpstreamError, match="closed the connection"):
            await pool.request("POST", url, "/x", b"{}")
        await backend.stop()
        with pytest.raises(UpstreamError, match="cannot connect"):
            await pool.request("POST", url, "/x", b"{}")

    run(scenario())


def test_a_backend_that_stalls_times_out_between_reads_not_over_the_whole_stream():
    async def slow_stream(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for n in range(4):  # each gap is under the read timeout, the whole stream is over it
            await asyncio.sleep(0.15)
            writer.write(b"%x\r\ndata: %d\n\r\n" % (len(b"data: 0\n"), n))
        writer.write(b"0\r\n\r\n")

    async def stall(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n")
        await asyncio.sleep(5)

    async def scenario():
        backend = Backend([slow_stream, stall])
        url = await backend.start()
        pool = Pool(1.0, 0.4)
        response = await pool.request("POST", url, "/x", b"{}")
        lines = [line async for line in response.lines()]
        stalled = await pool.request("POST", url, "/x", b"{}")
        with pytest.raises(UpstreamTimeout):
            await stalled.read()
        await backend.stop()
        return lines

    assert run(scenario()) == [f"data: {n}" for n in range(4)]


def test_a_stream_closed_early_drops_its_connection_instead_of_pooling_it():
    async def endless(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(200):
            writer.write(b"6\r\ndata:\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.write(b"0\r\n\r\n")

    async def scenario():
        backend = Backend([endless, ok(b"after")])
        url = await backend.start()
        pool = Pool(1.0, 5.0)
        response = await pool.request("POST", url, "/x", b"{}")
        lines = response.lines()
        assert await anext(lines) == "data:"
        await lines.aclose()  # the client hung up
        assert not any(pool.idle.values())
        answer = await (await pool.request("POST", url, "/x", b"{}")).read()
        await backend.stop()
        return answer, backend.connections

    assert run(scenario()) == (b"after", 2)


def test_garbage_from_the_backend_is_an_upstream_error():
    async def scenario():
        backend = Backend([b"this is not HTTP\r\n\r\n"])
        url = await backend.start()
        pool = Pool(1.0, 5.0)
        with pytest.raises(UpstreamError, match="invalid HTTP"):
            await pool.request("POST", url, "/x", b"{}")
        await backend.stop()

    run(scenario())
