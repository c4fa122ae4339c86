"""Shared fixtures: a simulated marketplace and the daily pipeline run over it, through Dagster,
with the real engines (polars, Feast with DuckDB and SQLite, great-expectations)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import pytest
from dagster import (
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    ExecuteInProcessResult,
    RunFailureSensorContext,
    build_run_status_sensor_context,
    deserialize_value,
    materialize,
    serialize_value,
)

from assets import all_assets
from jobs import daily_assets, training_data_assets
from orchestration.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from orchestration.profiles import resources_for
from resources.flink import FlinkResource
from simulator import Simulator, SimulatorConfig

pytest_plugins = ["tests.tiers"]  # the `services` tier

FIRST_DAY = date(2026, 1, 1)
DAYS = 3
LAST_DAY = FIRST_DAY + timedelta(days=DAYS - 1)
SMALL = SimulatorConfig(seed=11, start_date=FIRST_DAY).scaled(0.25)
# The live streaming slide in tests: hourly windows keep the Flink backfill of the history cheap.
TEST_SLIDE_SECONDS = 3600
EVERYTHING_DAILY = daily_assets | training_data_assets


def run_pipeline(
    data_dir: Path,
    first: date,
    last: date,
    selection: AssetSelection = daily_assets,
    instance: DagsterInstance | None = None,
    raise_on_error: bool = True,
):
    """Materialize `selection` for first..last in one run, as a single-run backfill does."""
    return materialize(
        all_assets,
        selection=selection,
        resources=local_resources(data_dir),
        instance=instance or DagsterInstance.ephemeral(),
        tags={ASSET_PARTITION_RANGE_START_TAG: first.isoformat(), ASSET_PARTITION_RANGE_END_TAG: last.isoformat()},
        raise_on_error=raise_on_error,
    )


def run_failure_context(instance: DagsterInstance, run_id: str, notifier) -> RunFailureSensorContext:
    """What `notify_run_failure` gets for the newest failed run of `instance`, with `notifier` as its resource."""
    from orchestration.sensors import notify_run_failure

    [failure] = instance.fetch_run_status_changes(DagsterEventType.RUN_FAILURE, limit=1).records
    return build_run_status_sensor_context(
        sensor_name=notify_run_failure.name,
        dagster_event=failure.event_log_entry.dagster_event,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run_id),
        resources={"notifier": notifier},
    ).for_run_failure()


def local_resources(data_dir: Path) -> dict:
    """The local profile over `data_dir`, with the tests' streaming slide."""
    resources = resources_for("local", data_dir=str(data_dir))
    return {
        **resources,
        "flink": FlinkResource(feature_store=resources["feature_store"], slide_seconds=TEST_SLIDE_SECONDS),
    }


def simulate(data_dir: Path, days: int = DAYS, config: SimulatorConfig = SMALL) -> Simulator:
    sim = Simulator(config, data_dir)
    sim.run(days)
    return sim


PROD_ENV = {
    "MLPLANE_REDIS_URL": "redis.internal:6379",
    "MLPLANE_FEAST_REGISTRY_URL": "postgresql+psycopg2://feast@db/feast",
    "MLPLANE_WEBHOOK_URL": "https://hooks.example/mlplane",
    "MLPLANE_QDRANT_URL": "http://qdrant.internal:6333",
    "MLPLANE_RAY_ADDRESS": "ray://ray-head.internal:10001",
    "MLPLANE_MLFLOW_TRACKING_URI": "http://mlflow.internal:5000",
    "MLPLANE_MLFLOW_ARTIFACT_ROOT": "s3://models/mlplane",
    "MLPLANE_GATEWAY_URL": "http://gateway.internal:4000",
    "MLPLANE_GATEWAY_KEY": "sk-mlp-service",
    "MLPLANE_LABELS_DB_URL": "postgresql+psycopg2://labels@db/labels",
    "MLPLANE_MODEL_SERVER_URL": "http://models.internal:8500",
}


@pytest.fixture
def prod_env(monkeypatch, tmp_path) -> dict[str, str]:
    """Every setting the prod profile reads from the environment, pointing at made-up services."""
    env = {**PROD_ENV, "MLPLANE_DATA_DIR": str(tmp_path)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def run_folder(tmp_path_factory) -> Path:
    """Where what is built once per run lives: beside the xdist workers' folders, shared by them and
    new for each run; without xdist, the session's folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


def built_once(path: Path, build: Callable[[Path], object]) -> Path:
    """`build(path)` by the first process to get here; the others wait on a file lock and reuse it.
    A build that failed leaves no marker, so the next process builds again from scratch."""
    done = path.with_name(path.name + ".built")
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the build raises
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            build(path)
            done.touch()
    return path


@pytest.fixture(scope="session")
def pipeline_dir(tmp_path_factory) -> Path:
    """Three simulated days, ingested, featurized, materialized online, their streaming history
    backfilled and turned into training data; a fourth day is simulated and ingested only, as the
    third day's labels look past its midnight.

    Built once per run (`built_once`): under xdist the first worker to ask builds it and the others
    wait for it. Read-only for its users: a test that writes to a lake copies this one."""
    return built_once(run_folder(tmp_path_factory) / "pipeline_lake", build_pipeline_lake)


def build_pipeline_lake(data_dir: Path) -> None:
    simulate(data_dir, days=DAYS + 1)
    next_day = LAST_DAY + timedelta(days=1)
    run_pipeline(data_dir, next_day, next_day, selection=AssetSelection.groups("ingestion"))
    result = run_pipeline(data_dir, FIRST_DAY, LAST_DAY, selection=EVERYTHING_DAILY)
    save_run(result, data_dir.with_name(PIPELINE_RUN))


PIPELINE_RUN = "pipeline_lake.run.json"  # beside the lake: copies of the lake leave it out


@pytest.fixture(scope="session")
def pipeline_run(pipeline_dir) -> ExecuteInProcessResult:
    """The run that built `pipeline_dir` (its first three days, streaming history and training sets
    included), read back from its events: tests of what it materialized need not run it again."""
    return read_run(pipeline_dir.with_name(PIPELINE_RUN))


@pytest.fixture(scope="session")
def personalization_run(pipeline_dir, tmp_path_factory) -> Path:
    """The personalization model trained by its Dagster assets over a copy of the pipeline's lake, once
    per run: tests/models' `trained` and tests/serving/models' `served_lake` use the same model. The folder
    holds `lake`, the `registry` (v1, promoted to champion by the run if it passed its gates) and the run's
    events (`training_result`). Read-only: users copy the registry with `copy_registry`."""
    ray_dir = tmp_path_factory.mktemp("ray")  # used only if this process has no Ray yet

    def build(folder: Path) -> None:
        from resources.ray import RayResource
        from tests.models.conftest import train

        lake = shutil.copytree(pipeline_dir, folder / "lake")
        with RayResource(num_cpus=2, object_store_mb=300, temp_dir=str(ray_dir)).session() as ray:
            result = train(lake, ray, folder / "registry", raise_on_error=False)
        save_run(result, folder / RUN_EVENTS)

    return built_once(run_folder(tmp_path_factory) / "personalization_run", build)


RUN_EVENTS = "run.json"


def training_result(run_folder: Path) -> ExecuteInProcessResult:
    """The training run's result (`personalization_run`)."""
    return read_run(run_folder / RUN_EVENTS)


def save_run(result: ExecuteInProcessResult, path: Path) -> None:
    path.write_text(serialize_value([result.dagster_run, *result.all_events]))


def read_run(path: Path) -> ExecuteInProcessResult:
    """A run's result read back from its events (`save_run`): what `materialize` returned to the process
    that ran it. Without the job's definition, which the result's event queries do not need."""
    run, *events = deserialize_value(path.read_text())
    return ExecuteInProcessResult(events, run, None, job_def=None)


def copy_registry(source: Path, target: Path) -> Path:
    """A copy of a local registry (`ModelRegistry.local`) that is its own: MLflow's database holds
    absolute artifact locations, which would still point into `source` (where new versions would go)."""
    shutil.copytree(source, target)
    old, new = str(source.resolve()), str(target.resolve())
    with contextlib.closing(sqlite3.connect(target / "mlflow.db")) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for _, column, kind, *_ in db.execute(f'PRAGMA table_info("{table}")').fetchall():
                if "CHAR" in kind.upper() or "TEXT" in kind.upper():
                    db.execute(
                        f'UPDATE "{table}" SET "{column}" = REPLACE("{column}", ?, ?) WHERE instr("{column}", ?)',
                        (old, new, old),
                    )
        db.commit()
    return target
