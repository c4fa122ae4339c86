from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from orchestration.definitions import defs
from orchestration.profiles import PROJECT_ROOT
from tests.conftest import simulate

BIN = Path(sys.executable).parent


@pytest.mark.services  # a dagster subprocess
def test_definitions_validate():
    out = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful" in out.stdout + out.stderr


@pytest.mark.services  # a fresh process: warnings are shown once per process
def test_loading_the_definitions_warns_of_nothing_chosen_knowingly():
    """Beta APIs and the time-partition freshness checks are chosen knowingly (assets/__init__.py says why):
    Dagster's warnings about them filled every command's terminal, the demo's and the UI's."""
    out = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import orchestration.definitions"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "SupersessionWarning" not in out.stderr and "BetaWarning" not in out.stderr, out.stderr


def test_every_job_has_one_backfill_policy():
    """Dagster runs a job's range by one policy: with several it warns and takes the smallest, so a range
    of an asset that loads ranges in one run would silently run a day at a time (or the reverse)."""
    import warnings

    from orchestration.dagster_internals import UnresolvedAssetJobDefinition

    graph = defs.resolve_asset_graph()
    jobs = [job for job in defs.jobs if isinstance(job, UnresolvedAssetJobDefinition)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for job in jobs:  # resolved afresh: the repository's own resolution warns once per process
            job.resolve(asset_graph=graph)
    varying = [str(w.message).splitlines()[0] for w in caught if "varying BackfillPolicies" in str(w.message)]
    assert "online_monitoring" in [job.name for job in jobs] and not varying, varying


def test_every_asset_reads_well_in_the_ui():
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        spec = graph.get(key)
        assert spec.group_name and spec.group_name != "default", key
        assert spec.owners, key
        assert spec.kinds, key
        assert spec.description and len(spec.description) > 20, key
    assert defs.resolve_job_def("daily_pipeline").partitions_def is not None


def test_daily_assets_have_quality_and_freshness_checks():
    checks = defs.resolve_asset_graph().asset_check_keys
    for key in (
        AssetKey(["warehouse", "interactions"]),
        AssetKey(["offline", "user_engagement"]),
        AssetKey(["datasets", "personalization_training"]),
    ):
        names = {c.name for c in checks if c.asset_key == key}
        assert {"great_expectations", "freshness_check"} <= names, (key, names)


@pytest.mark.services  # a dagster subprocess
def test_three_day_backfill_with_the_dagster_cli(tmp_path):
    data_dir, home = tmp_path / "lake", tmp_path / "home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    simulate(data_dir, days=4)  # the third day's labels look past its midnight
    env = {
        **os.environ,
        "MLPLANE_DATA_DIR": str(data_dir),
        "DAGSTER_HOME": str(home),
        "MLPLANE_STREAMING_SLIDE_SECONDS": "3600",
    }
    daily = "group:ingestion,group:geometry,group:features,online_features"
    for selection, days in (
        (daily, "2026-01-01...2026-01-04"),
        ("group:streaming_history,group:datasets", "2026-01-01...2026-01-03"),
    ):
        out = subprocess.run(
            [
                str(BIN / "dagster"),
                "asset",
                "materialize",
                "-m",
                "orchestration.definitions",
                "--select",
                selection,
                "--partition-range",
                days,
            ],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-3000:]

    instance = DagsterInstance.from_config(str(home))
    try:
        for key in (
            AssetKey(["warehouse", "interactions"]),
            AssetKey(["offline", "user_engagement"]),
            AssetKey(["datasets", "personalization_training"]),
        ):
            materialized = instance.get_materialized_partitions(key)
            assert {"2026-01-01", "2026-01-02", "2026-01-03"} <= materialized, key
    finally:
        instance.dispose()
    for day in ("2026-01-01", "2026-01-02", "2026-01-03"):
        assert (data_dir / "datasets" / "personalization_training" / f"date={day}" / "part-0.parquet").exists()


@pytest.mark.services  # a dagster subprocess
def test_prod_profile_reads_its_services_from_the_environment(prod_env, monkeypatch, tmp_path):
    from dagster import build_resources

    from orchestration.profiles import resources_for

    with build_resources(resources_for("prod")) as resources:
        config = resources.feature_store.get_client().settings.config_dict()
        assert config["online_store"] == {
            "type": "redis",
            "connection_string": "redis.internal:6379",
            "skip_dedup": True,
        }
        assert config["registry"]["path"] == "postgresql+psycopg2://feast@db/feast"
        assert resources.lake.root == str(tmp_path)
        assert resources.notifier.url == "https://hooks.example/mlplane"
        assert resources.vector_store.location == "http://qdrant.internal:6333"
        assert resources.ray.address == "ray://ray-head.internal:10001"
        assert resources.model_registry.get_client().tracking_uri == "http://mlflow.internal:5000"
        assert resources.model_registry.artifact_root == "s3://models/mlplane"
        assert (resources.gateway.url, resources.gateway.api_key) == ("http://gateway.internal:4000", "sk-mlp-service")
        assert resources.labels.database_url() == "postgresql+psycopg2://labels@db/labels"

    monkeypatch.setenv("MLPLANE_PROFILE", "staging")
    out = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-m", "orchestration.definitions"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "MLPLANE_PROFILE must be one of local, prod" in out.stdout + out.stderr


def test_the_cli_configures_prod_resources_as_a_run_does(prod_env, monkeypatch):
    """CLI commands read the prod profile's EnvVars (not their names), and name the ones left unset."""
    from click.testing import CliRunner

    from cli.main import main
    from orchestration.profiles import open_resource

    monkeypatch.setenv("MLPLANE_PROFILE", "prod")
    with open_resource("feature_store") as feature_store:
        assert feature_store.redis_url == "redis.internal:6379"
        assert feature_store.lake.root == prod_env["MLPLANE_DATA_DIR"]
    monkeypatch.delenv("MLPLANE_REDIS_URL")
    monkeypatch.delenv("MLPLANE_MLFLOW_TRACKING_URI")
    features = CliRunner().invoke(main, ["features", "get", "search", "--entity", "item_id=3"])
    assert (
        features.exit_code != 0
        and "feature_store resource needs configuration: set MLPLANE_REDIS_URL" in features.output
    ), features.output
    models = CliRunner().invoke(main, ["models", "list"])
    assert models.exit_code != 0 and "set MLPLANE_MLFLOW_TRACKING_URI" in models.output, models.output
