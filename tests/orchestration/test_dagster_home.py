"""In prod the CLI never falls back to the project's local Dagster instance (SQLite in .dagster_home)."""

from __future__ import annotations

import click
import pytest

from orchestration.home import ensure_dagster_home
from orchestration.profiles import PROJECT_ROOT


def test_prod_without_dagster_home_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("MLPLANE_PROFILE", "prod")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with pytest.raises(click.ClickException, match="DAGSTER_HOME"):
        ensure_dagster_home()


def test_prod_refuses_a_home_without_its_dagster_yaml(monkeypatch, tmp_path):
    monkeypatch.setenv("MLPLANE_PROFILE", "prod")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with pytest.raises(click.ClickException, match="no dagster.yaml"):
        ensure_dagster_home()
    assert not (tmp_path / "dagster.yaml").exists()  # the local one was not linked in


def test_prod_uses_the_home_it_is_given(monkeypatch):
    monkeypatch.setenv("MLPLANE_PROFILE", "prod")
    monkeypatch.setenv("DAGSTER_HOME", str(PROJECT_ROOT / "deploy" / "prod"))
    assert ensure_dagster_home() == PROJECT_ROOT / "deploy" / "prod"
