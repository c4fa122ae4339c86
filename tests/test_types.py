"""The type checker, run as part of the suite: mypy with the settings and the list of modules still in
debt in pyproject.toml ([tool.mypy]). A new module is checked from its first commit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# mypy's incremental cache outside the checkout, so that a clean checkout on the same machine (CI) starts warm:
# the libraries' stubs (torch, Dagster, Ray) are most of a cold run. mypy checks each entry against its source
# file and its own version and options, so a stale entry is rechecked, never trusted.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlplane" / "mypy"


@pytest.mark.services  # a subprocess that reads the whole product: about two CPU-minutes without a cache
def test_the_product_type_checks():
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(CACHE)]
        + ["--no-error-summary"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_type_checker_catches_an_error(tmp_path):
    """The settings check what they claim: an error in a module off the debt list fails."""
    bad = tmp_path / "typed.py"
    bad.write_text("def f(x: int) -> str:\n    return x\n\n\ndef g():\n    y: int = 'a'\n")
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(bad)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 1
    assert "typed.py:2: error" in checked.stdout and "typed.py:6: error" in checked.stdout  # an untyped def too
