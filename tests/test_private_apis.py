"""Private Dagster and Feast calls live in one module each (orchestration/dagster_internals.py,
engines/features/feast_internals.py), so an upgrade of either is checked in one place. This test reads every
Python file of the repository and fails on a private import or call anywhere else."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DAGSTER_INTERNALS = ROOT / "orchestration" / "dagster_internals.py"
FEAST_INTERNALS = ROOT / "engines" / "features" / "feast_internals.py"
# Feast's private methods reached through objects (a FeatureStore, an online store), not through a module
FEAST_PRIVATE_METHODS = {"_get_provider", "_get_conn", "_quote_id", "_table_id", "_get_registry", "_registry"}


def python_files() -> list[Path]:
    skip = {".git", "data", "build", "node_modules"}
    return [
        p
        for p in ROOT.rglob("*.py")
        if not any(part in skip or part.startswith(".venv") for part in p.relative_to(ROOT).parts)
    ]


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each private Dagster import and each private Feast import or call in `source`."""
    tree = ast.parse(source)
    feast_names = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("dagster._"):
                found.append((node.lineno, f"from {node.module} import ..."))
            if node.module.split(".")[0] == "feast":
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.append((node.lineno, f"from {node.module} import {alias.name}"))
                    feast_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dagster._"):
                    found.append((node.lineno, f"import {alias.name}"))
                if alias.name.split(".")[0] == "feast":
                    feast_names.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            on_feast_module = isinstance(node.value, ast.Name) and node.value.id in feast_names
            if on_feast_module or node.attr in FEAST_PRIVATE_METHODS:
                found.append((node.lineno, f"Feast's {node.attr}"))
    return found


def test_the_check_finds_what_it_forbids():
    source = (
        "from dagster._core.storage.tags import X\n"
        "import dagster._serdes\n"
        "from feast.infra.online_stores import sqlite\n"
        "t = sqlite._table_id(p, v, False)\n"
        "o = store._get_provider().online_store\n"
    )
    assert [line for line, _ in private_uses(source)] == [1, 2, 4, 5]
    assert private_uses("from dagster import asset\nimport feast\nx = self._cache\n") == []


def test_private_dagster_and_feast_calls_live_in_their_one_module_each():
    allowed = {DAGSTER_INTERNALS, FEAST_INTERNALS, Path(__file__).resolve()}
    found = {
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in python_files()
        if path not in allowed
        for line, what in private_uses(path.read_text())
    }
    assert not found, "use orchestration/dagster_internals.py or engines/features/feast_internals.py:\n" + "\n".join(
        sorted(found)
    )


@pytest.mark.parametrize("module", ["orchestration.dagster_internals"])
def test_every_dagster_internal_name_still_exists(module):
    """A Dagster upgrade that moves a private name fails here, naming it, not deep inside a run."""
    import importlib

    internals = importlib.import_module(module)
    missing = []
    for name in internals.__all__:
        try:
            getattr(internals, name)
        except (AttributeError, ImportError) as error:
            missing.append(f"{name}: {error}")
    assert not missing
