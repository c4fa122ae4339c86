"""The layout docs/architecture.md states: engines grouped by system (every module of `engines/` lives in a
subpackage whose `__init__.py` says what system it is), and the model server's kinds, front ends and hooks
in their own subpackages. A module added at the top of `engines/` fails here and names itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_engine_lives_in_a_documented_system_package():
    loose = [p.name for p in (ROOT / "engines").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"put these in the engines/ subpackage of their system: {loose}"
    packages = [p for p in (ROOT / "engines").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))]
    assert len(packages) >= 5
    for package in packages:
        init = package / "__init__.py"
        assert init.exists(), f"{package.name} is not a package"
        assert ast.get_docstring(ast.parse(init.read_text())), f"engines/{package.name}/__init__.py says nothing"


def test_the_model_server_keeps_front_ends_kinds_and_hooks_apart():
    served = ROOT / "serving" / "models"
    for part, members in {
        "protocols": ("app.py", "grpc_server.py"),
        "kinds": ("towers.py", "encoders.py"),
        "hooks": ("experiments.py", "prediction_log.py"),
    }.items():
        assert all((served / part / member).exists() for member in members), part
        assert ast.get_docstring(ast.parse((served / part / "__init__.py").read_text())), part
