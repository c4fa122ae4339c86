"""Run the model server in a background thread on a free local port (the demo, examples)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from serving.models.config import ServerConfig
from serving.models.protocols.app import create_app
from serving.models.server import ModelServer


@contextmanager
def running_model_server(config: ServerConfig, timeout_s: float = 120) -> Iterator[str]:
    """The server (uvicorn, one process) on 127.0.0.1:<free port>; yields its base URL. Leaving the block
    stops it cleanly: shadows in flight finish and the prediction log is written."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(ModelServer(config)), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the model server did not start (is a champion registered?); see the log above")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()
