"""`mlplane ui` as a new user runs it. The demo, `features get` and `inject` run as the README writes
them, on the demo's lake, in tests/test_readme.py (which also checks what the demo produced)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.services  # an `mlplane ui` subprocess (Dagster webserver and daemon)

MLPLANE = str(Path(sys.executable).with_name("mlplane"))


def test_ui_starts_without_an_activated_environment(tmp_path):
    """`.venv/bin/mlplane ui` with no .venv/bin on PATH, as the README says to run it."""
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",
        "DAGSTER_HOME": str(tmp_path / "home"),
        "MLPLANE_DATA_DIR": str(tmp_path / "lake"),
    }
    ui = subprocess.Popen(
        [MLPLANE, "ui", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and ui.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert ui.poll() is None, ui.stdout.read()[-3000:]
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
        assert info["dagster_webserver_version"]
    finally:
        os.killpg(ui.pid, signal.SIGKILL)
        ui.wait()
