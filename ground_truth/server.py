"""Run the labeling app in a background thread on a free local port (tests, benchmarks, demos)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from ground_truth.app import create_app
from ground_truth.refit import RefitPolicy
from ground_truth.throttle import SignInThrottle


@contextmanager
def serve_app(
    database_url: str,
    media_root: Path | None = None,
    throttle: SignInThrottle | None = None,
    refit: RefitPolicy | None = RefitPolicy(),  # noqa: B008 (frozen)
) -> Iterator[str]:
    """The app (uvicorn, one process) on 127.0.0.1:<free port> in a background thread; yields its base URL."""
    app = create_app(database_url, media_root, throttle, refit)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("labeling app did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        app.state.engine.dispose()
        app.state.sign_in.hashing.close()
        sock.close()
