"""`mlplane` starts without the heavy engines: a command imports Feast, great-expectations, MLflow,
torch or Ray when it uses them, so `mlplane gateway keys list` does not wait seconds for Feast."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("feast", "great_expectations", "mlflow", "torch", "ray")


def test_the_cli_and_the_profiles_import_no_heavy_engine():
    probe = (
        "import sys, orchestration.cli, orchestration.profiles as p; p.resources_for('local', '/tmp/x'); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
