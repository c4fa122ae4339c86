"""A prod-profile run writes nothing into the checkout: its Dagster storage, compute logs, run artifacts,
lake and feature registry all go where the settings say.

The run is the `dagster` CLI's, in a copy of the checkout made a git repository (its working tree with
uncommitted edits, so the code under test is this one), with DAGSTER_HOME on the copy's deploy/prod as
docs/operations.md says, against this machine's PostgreSQL and Redis, every folder setting on a temporary
folder. Afterwards `git status --porcelain --ignored` of the copy is empty: nothing new, changed or
ignored. Python's bytecode caches are turned off (PYTHONDONTWRITEBYTECODE): they are the interpreter's,
and an image compiles them at build time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg2
import pytest

from orchestration.profiles import PROJECT_ROOT
from simulator import Simulator
from tests.conftest import FIRST_DAY, PROD_ENV, SMALL
from tests.services import REDIS, create_database, drop_database

GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost", "-c", "core.hooksPath=/dev/null"]


def checkout_copy(target: Path) -> Path:
    """The checkout's tracked and unignored files (not the environments it links), committed in a new repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = PROJECT_ROOT / name
        if source.is_file() and not source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        subprocess.run([*GIT, *command], cwd=target, check=True, capture_output=True)
    return target


@pytest.fixture()
def databases():
    names = [f"mlplane_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("dagster", "feast")]
    urls = [create_database(name).replace("postgresql://", "postgresql+psycopg2://") for name in names]
    yield urls
    for name in names:
        drop_database(name)


@pytest.mark.services  # a `dagster` subprocess on PostgreSQL and Redis
def test_a_prod_run_writes_nothing_into_the_checkout(tmp_path, databases):
    checkout = checkout_copy((tmp_path / "checkout").resolve())
    lake, dagster_url, feast_url = tmp_path / "lake", *databases
    Simulator(SMALL.scaled(0.2), lake).run(1)
    env = {
        **os.environ,
        **PROD_ENV,
        "MLPLANE_PROFILE": "prod",
        "DAGSTER_HOME": str(checkout / "deploy" / "prod"),
        "MLPLANE_DAGSTER_PG_URL": dagster_url,
        "MLPLANE_FEAST_REGISTRY_URL": feast_url,
        "MLPLANE_REDIS_URL": REDIS,
        "MLPLANE_DATA_DIR": str(lake),
        "MLPLANE_COMPUTE_LOGS_DIR": str(tmp_path / "compute_logs"),
        "MLPLANE_DAGSTER_STORAGE_DIR": str(tmp_path / "dagster_storage"),
        "PYTHONPATH": str(checkout),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("MLPLANE_WEBHOOK_URL")  # a made-up host: the run succeeds, nothing is posted
    dagster = Path(sys.executable).parent / "dagster"
    selection = "feature_registry,group:ingestion"
    run = subprocess.run(
        [
            str(dagster),
            "asset",
            "materialize",
            "-m",
            "orchestration.definitions",
            "--select",
            selection,
            "--partition",
            FIRST_DAY.isoformat(),
        ],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]

    status = subprocess.run(
        [*GIT, "status", "--porcelain", "--ignored"], cwd=checkout, capture_output=True, text=True, check=True
    )
    assert status.stdout == ""
    # where it did write: the run in PostgreSQL, its steps' logs and the lake in the configured folders
    with psycopg2.connect(dagster_url.replace("+psycopg2", "")) as conn:
        cur = conn.cursor()
        cur.execute("SELECT status FROM runs")
        assert cur.fetchall() == [("SUCCESS",)]
    assert any(p.suffix in (".out", ".err") for p in (tmp_path / "compute_logs").rglob("*"))
    assert (lake / "warehouse").is_dir()
