"""The prod Dagster instance keeps compute logs and run artifacts outside the checkout, where its
variables say (shared storage for remote run launchers): no PostgreSQL needed to read them."""

from __future__ import annotations

import yaml

from orchestration.dagster_internals import ConfigurableClassData, dagster_instance_config
from orchestration.profiles import PROJECT_ROOT


def configured(section: dict):
    return ConfigurableClassData(section["module"], section["class"], yaml.dump(section["config"])).rehydrate(
        as_type=object
    )


def test_prod_compute_logs_and_artifacts_go_where_the_variables_say(monkeypatch, tmp_path):
    monkeypatch.setenv("MLPLANE_DAGSTER_PG_URL", "postgresql+psycopg2://dagster@db:5432/dagster")
    monkeypatch.setenv("MLPLANE_COMPUTE_LOGS_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("MLPLANE_DAGSTER_STORAGE_DIR", str(tmp_path / "storage"))
    config, _ = dagster_instance_config(str(PROJECT_ROOT / "deploy" / "prod"))
    assert configured(config["compute_logs"])._base_dir == str(tmp_path / "logs")
    assert configured(config["local_artifact_storage"]).base_dir == str(tmp_path / "storage")
