"""`mlplane` starts without the heavy engines: a command imports Feast, great-expectations, MLflow,
torch or Ray when it uses them, so `mlplane gateway keys list` does not wait seconds for Feast; and the
Dagster definitions (every `dagster` command, the UI's code server, each run) load without
great-expectations."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.services  # a fresh interpreter: the test process has imported everything already

HEAVY = ("feast", "great_expectations", "mlflow", "torch", "ray")


def test_the_cli_and_the_profiles_import_no_heavy_engine():
    probe = (
        "import sys, cli.main, orchestration.profiles as p; p.resources_for('local', '/tmp/x'); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_definitions_load_without_great_expectations():
    """Suites are declared as specs (engines/data/expectations.py); GX loads when a check validates."""
    probe = "import sys, orchestration.definitions; print('great_expectations' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout
