"""docs/operations.md's walkthrough from zero to production, as far as this machine can check it: its
settings block is every setting the prod profile needs (`mlplane doctor` finds none missing or
malformed, the gateway's prod YAML loads on it), and each `mlplane`, Dagster and Ray command parses with
the options written. Its blocks are `sh`, not `bash`: tests/test_readme.py runs the bash blocks on the
local profile, and these name hosts that do not exist here."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import uuid
from importlib.metadata import entry_points
from pathlib import Path

import click
import pytest

from orchestration.profiles import PROJECT_ROOT
from tests.services import create_database, drop_database

GUIDE = PROJECT_ROOT / "docs" / "operations.md"


def walkthrough_commands() -> list[str]:
    text = GUIDE.read_text()
    section = text.split("## From zero to production", 1)[1].split("\n## ", 1)[0]
    return [
        line.strip()
        for body in re.findall(r"```sh\n(.*?)```", section, re.S)
        for line in body.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_the_walkthrough_has_its_steps():
    commands = walkthrough_commands()
    for start in (
        "export MLPLANE_PROFILE=prod",
        ".venv/bin/mlplane doctor",
        ".venv/bin/dagster-daemon run",
        ".venv/bin/mlplane models promote",
        ".venv/bin/mlplane models rollback",
    ):
        assert any(c.startswith(start) for c in commands), start


def settings_environment(tmp_path: Path) -> dict[str, str]:
    """The environment after the guide's export and mkdir lines, its shared storage under `tmp_path`."""
    lines = [c.replace("/srv/mlplane", str(tmp_path)) for c in walkthrough_commands()]
    script = "\n".join(c for c in lines if c.startswith(("export ", "mkdir "))) + "\nenv -0"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLPLANE_", "DAGSTER_", "AWS_", "MLFLOW_"))}
    out = subprocess.run(["bash", "-c", script], cwd=PROJECT_ROOT, env=clean, capture_output=True, check=True)
    return dict(entry.decode().split("=", 1) for entry in out.stdout.split(b"\0") if entry)


@pytest.mark.services  # an `mlplane` subprocess
def test_the_settings_block_is_complete_for_the_prod_profile(tmp_path):
    env = settings_environment(tmp_path)
    assert env["MLPLANE_PROFILE"] == "prod" and env["DAGSTER_HOME"] == str(PROJECT_ROOT / "deploy" / "prod")
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    mlplane = str(Path(sys.executable).parent / "mlplane")
    doctor = subprocess.run(
        [mlplane, "doctor", "--gateway-config", "deploy/prod/gateway.yaml"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "the prod profile's" in doctor.stdout and "settings are complete" in doctor.stdout


def console_script(name: str) -> click.Command:
    """The click command of an installed program: its entry point, or (where that is a plain `main()`
    calling it) its module's `cli`."""
    [script] = [e for e in entry_points(group="console_scripts") if e.name == name]
    loaded = script.load()
    return loaded if isinstance(loaded, click.Command) else vars(importlib.import_module(script.module))["cli"]


@pytest.mark.parametrize("command", [c for c in walkthrough_commands() if c.startswith(".venv/bin/")])
def test_each_command_parses_with_its_options(command, monkeypatch):
    monkeypatch.setenv("MLPLANE_LABELING_PASSWORD", "unused")  # the one option that would prompt
    program, *args = shlex.split(command)
    current = console_script(Path(program).name)
    path = [Path(program).name]
    while isinstance(current, click.Group) and args and not args[0].startswith("-"):
        name, args = args[0], args[1:]
        found = current.get_command(click.Context(current), name)
        assert found is not None, f"{' '.join(path)} has no command {name!r}: {command}"
        current, path = found, [*path, name]
    # parses and validates every option and argument (types, choices, required ones) without running
    current.make_context(" ".join(path), list(args))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.services  # the code location and the daemon, on this machine's PostgreSQL
def test_the_dagster_units_start_as_written(tmp_path):
    """Step 5's code location and daemon, started with the guide's commands and settings (the code
    location's host and port this machine's), until the daemon's liveness check passes."""
    name = f"mlplane_dagster_{uuid.uuid4().hex[:8]}"
    env = {
        **settings_environment(tmp_path),
        "MLPLANE_DAGSTER_PG_URL": create_database(name).replace("postgresql://", "postgresql+psycopg2://"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    port = str(free_port())
    bin_dir = str(Path(sys.executable).parent)
    code, daemon, check = [
        shlex.split(c.replace("code.example", "127.0.0.1").replace("4000", port).replace(".venv/bin", bin_dir))
        for c in walkthrough_commands()
        if c.startswith((".venv/bin/dagster api grpc", ".venv/bin/dagster-daemon"))
    ]
    units = []
    try:
        for command in (code, daemon):
            log = (tmp_path / f"{Path(command[0]).name}.log").open("w")
            units.append(subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 300  # a hang, not a speed: loading the definitions takes a while
        while (live := subprocess.run(check, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)).returncode:
            assert all(u.poll() is None for u in units), [p.read_text()[-3000:] for p in tmp_path.glob("*.log")]
            assert time.monotonic() < deadline, live.stdout + [p.read_text()[-3000:] for p in tmp_path.glob("*.log")]
            time.sleep(2)
        assert "Daemon live" in live.stdout
    finally:
        for unit in units:
            unit.terminate()
            unit.wait(timeout=30)
        drop_database(name)
