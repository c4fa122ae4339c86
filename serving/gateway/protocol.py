"""uvicorn's httptools protocol with its writes coalesced: uvicorn sends a response's status line and
headers in one socket write and the body in another, two system calls (and two TCP segments) where one
does. Here the writes of one event-loop iteration leave together at the end of that iteration, in the
order they were made; close and abort behave as on the socket's own transport."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """Holds a transport's writes until the loop's next turn, then sends them as one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self.transport, self.loop = transport, loop
        self.pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self.pending:
            self.loop.call_soon(self.flush)
        self.pending.append(data)

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if pending and not self.transport.is_closing():
            self.transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self.pending = []
        self.transport.abort()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + sum(len(chunk) for chunk in self.pending)

    def __getattr__(self, name: str):  # everything else is the transport's own
        return getattr(self.transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
