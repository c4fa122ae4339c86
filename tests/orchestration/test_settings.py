"""One list of settings (orchestration/settings.py): docs/operations.md's table is generated from it, it
declares every variable the code reads, and `mlplane doctor` names each missing or malformed one."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from dagster import DagsterInvalidConfigError, build_resources

from cli.main import main
from orchestration.profiles import PROJECT_ROOT, resources_for
from orchestration.settings import DOCS, SETTINGS, declared, with_table

SOURCE_FOLDERS = (
    "orchestration",
    "cli",
    "demo",
    "simulator",
    "resources",
    "assets",
    "jobs",
    "engines",
    "serving",
    "ml",
    "ground_truth",
    "deploy",
)


def test_the_operations_page_holds_the_generated_table():
    page = DOCS.read_text()
    assert with_table(page) == page, "run .venv/bin/python -m orchestration.settings"
    assert all(f"`{s.name}`" in page for s in SETTINGS)


def test_every_variable_the_code_reads_is_declared():
    read = set()
    for folder in SOURCE_FOLDERS:
        for path in (PROJECT_ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".yaml", ".yml") and ".venv" not in path.parts:
                read |= set(re.findall(r"MLPLANE_[A-Z0-9_]+", path.read_text(errors="ignore")))
    assert {"MLPLANE_QDRANT_URL", "MLPLANE_DAGSTER_PG_URL"} <= read  # the scan sees code and deploy files
    assert sorted(name for name in read if not declared(name)) == []


def test_every_variable_the_prod_resources_need_is_required_in_prod(monkeypatch):
    for name in [s.name for s in SETTINGS]:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DagsterInvalidConfigError) as error:
        with build_resources(resources_for("prod", data_dir="/tmp/lake")):
            pass
    unset = set(re.findall(r'environment variable "([^"]+)" which is not set', str(error.value)))
    assert unset and unset <= {s.name for s in SETTINGS if s.required("prod")}


@pytest.fixture
def complete_prod(prod_env, monkeypatch) -> dict[str, str]:
    """prod_env and what only the Dagster instance and the streaming jobs read."""
    extra = {
        "MLPLANE_PROFILE": "prod",
        "DAGSTER_HOME": str(PROJECT_ROOT / "deploy" / "prod"),
        "MLPLANE_DAGSTER_PG_URL": "postgresql+psycopg2://dagster@db:5432/dagster",
        "MLPLANE_FLINK_REST_URL": "http://flink-jobmanager:8081",
        "MLPLANE_KAFKA_BOOTSTRAP_SERVERS": "kafka.internal:9092",
        "MLPLANE_COMPUTE_LOGS_DIR": "/mnt/dagster/logs",
        "MLPLANE_DAGSTER_STORAGE_DIR": "/mnt/dagster/storage",
    }
    for name, value in extra.items():
        monkeypatch.setenv(name, value)
    return {**prod_env, **extra}


def doctor():
    return CliRunner().invoke(main, ["doctor"])


def test_doctor_passes_a_complete_prod_environment(complete_prod):
    result = doctor()
    assert result.exit_code == 0, result.output
    assert "the prod profile's" in result.output and "settings are complete" in result.output


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("MLPLANE_FLINK_REST_URL", None, "MLPLANE_FLINK_REST_URL is not set"),
        ("MLPLANE_MODEL_SERVER_URL", None, "MLPLANE_MODEL_SERVER_URL is not set"),
        ("DAGSTER_HOME", None, "DAGSTER_HOME is not set"),
        ("DAGSTER_HOME", str(PROJECT_ROOT / "docs"), "DAGSTER_HOME: '"),
        ("MLPLANE_QDRANT_URL", "/mnt/vectors", "MLPLANE_QDRANT_URL: '/mnt/vectors' is not a http:// or https:// URL"),
        ("MLPLANE_DAGSTER_PG_URL", "postgresql://db/dagster", "MLPLANE_DAGSTER_PG_URL: "),
        ("MLPLANE_COMPUTE_LOGS_DIR", str(PROJECT_ROOT / "deploy" / "prod" / "storage"), "is inside the checkout"),
        ("MLPLANE_RAY_ADDRESS", "ray-head", "MLPLANE_RAY_ADDRESS: 'ray-head' is not"),
        ("MLPLANE_DATA_DIR", "/no/such/mount", "MLPLANE_DATA_DIR: '/no/such/mount' is not an existing folder"),
        ("MLPLANE_NOTIFY_ML_ONCALL", "oncall@example.com", "MLPLANE_NOTIFY_ML_ONCALL: "),
        ("MLPLANE_PROFILE", "production", "MLPLANE_PROFILE: 'production' is not local or prod"),
    ],
)
def test_doctor_names_each_missing_or_malformed_setting(complete_prod, monkeypatch, name, value, named):
    if value is None:
        monkeypatch.delenv(name)
    else:
        monkeypatch.setenv(name, value)
    result = doctor()
    assert result.exit_code == 1
    assert named in result.output and "to fix (docs/operations.md)" in result.output


def test_doctor_allows_an_embedded_qdrant_only_when_told(complete_prod, monkeypatch, tmp_path):
    monkeypatch.setenv("MLPLANE_QDRANT_URL", str(tmp_path))
    assert doctor().exit_code == 1
    monkeypatch.setenv("MLPLANE_ALLOW_EMBEDDED", "1")
    assert doctor().exit_code == 0


def test_doctor_notes_an_unset_webhook_without_failing(complete_prod, monkeypatch):
    monkeypatch.delenv("MLPLANE_WEBHOOK_URL")
    result = doctor()
    assert result.exit_code == 0 and "MLPLANE_WEBHOOK_URL is not set (optional)" in result.output


def test_doctor_lists_every_required_setting_of_an_empty_prod_environment(monkeypatch):
    for name in [s.name for s in SETTINGS]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLPLANE_PROFILE", "prod")
    result = doctor()
    assert result.exit_code == 1
    for setting in SETTINGS:
        assert (f"{setting.name} is not set:" in result.output) == setting.required("prod")


def test_the_local_profile_needs_nothing(monkeypatch):
    for name in [s.name for s in SETTINGS]:
        monkeypatch.delenv(name, raising=False)
    assert doctor().exit_code == 0
