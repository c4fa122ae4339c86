"""The prod profile's Dagster instance against the real PostgreSQL server."""

from __future__ import annotations

import shutil
import uuid

import psycopg2
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, materialize

from assets.features import feature_registry
from orchestration.profiles import PROJECT_ROOT, resources_for
from tests.services import create_database, drop_database


@pytest.fixture()
def prod_home(tmp_path, monkeypatch):
    """A fresh database on the real server and DAGSTER_HOME holding deploy/prod/dagster.yaml."""
    name = f"mlplane_dagster_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    shutil.copy(PROJECT_ROOT / "deploy" / "prod" / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("MLPLANE_DAGSTER_PG_URL", url.replace("postgresql://", "postgresql+psycopg2://"))
    monkeypatch.setenv("MLPLANE_COMPUTE_LOGS_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("MLPLANE_DAGSTER_STORAGE_DIR", str(tmp_path / "storage"))
    yield tmp_path, url
    drop_database(name)


def test_prod_instance_stores_runs_in_postgres_and_queues_by_pool(prod_home, tmp_path):
    home, url = prod_home
    instance = DagsterInstance.from_config(str(home))
    try:
        coordinator = instance.run_coordinator
        assert type(coordinator).__name__ == "QueuedRunCoordinator"
        limits = {
            (rule["key"], rule["value"]): rule["limit"]
            for rule in coordinator.get_run_queue_config().tag_concurrency_limits
        }
        assert limits[("mlplane/pool", "gpu")] < limits[("mlplane/pool", "cpu")]

        result = materialize(
            [feature_registry], instance=instance, resources=resources_for("local", data_dir=str(tmp_path / "lake"))
        )
        assert result.success
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
        assert [r.run_id for r in runs] == [result.run_id]
    finally:
        instance.dispose()

    with psycopg2.connect(url) as conn:  # read back from the server itself, not through Dagster
        cur = conn.cursor()
        cur.execute("SELECT run_id, status FROM runs")
        assert cur.fetchall() == [(result.run_id, "SUCCESS")]
        cur.execute("SELECT count(*) FROM event_logs WHERE run_id = %s", (result.run_id,))
        assert cur.fetchone()[0] > 5
