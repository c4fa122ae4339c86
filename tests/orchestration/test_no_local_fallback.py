"""The prod profile never falls back to an embedded engine or a local default without a word."""

from __future__ import annotations

import pytest
from dagster import AssetSelection, DagsterInstance, build_resources, materialize

from assets import all_assets
from orchestration.profiles import resources_for
from tests.conftest import FIRST_DAY


def test_prod_refuses_a_qdrant_folder_naming_the_variable(prod_env, monkeypatch, tmp_path):
    monkeypatch.setenv("MLPLANE_QDRANT_URL", str(tmp_path / "vectors"))
    with build_resources({"vector_store": resources_for("prod")["vector_store"]}) as resources:
        with pytest.raises(ValueError, match="MLPLANE_QDRANT_URL.*folder.*MLPLANE_ALLOW_EMBEDDED"):
            resources.vector_store.get_client()
    assert not (tmp_path / "vectors").exists()  # refused before the embedded engine made its folder


def test_prod_embeds_qdrant_only_when_a_setting_allows_it(prod_env, monkeypatch, tmp_path):
    monkeypatch.setenv("MLPLANE_QDRANT_URL", str(tmp_path / "vectors"))
    monkeypatch.setenv("MLPLANE_ALLOW_EMBEDDED", "1")
    with build_resources({"vector_store": resources_for("prod")["vector_store"]}) as resources:
        with resources.vector_store.get_client() as store:
            assert store.location == str(tmp_path / "vectors")


def test_the_local_profile_embeds_qdrant_in_the_lake(tmp_path):
    with build_resources({"vector_store": resources_for("local", str(tmp_path))["vector_store"]}) as resources:
        with resources.vector_store.get_client() as store:
            assert store.location == str(tmp_path / "vectors")


def test_a_prod_training_data_run_without_flink_names_the_variable(prod_env, monkeypatch):
    """The streaming history, the training sets' input, fails first thing, naming what to set."""
    monkeypatch.delenv("MLPLANE_FLINK_REST_URL", raising=False)
    monkeypatch.setenv("MLPLANE_KAFKA_BOOTSTRAP_SERVERS", "kafka.internal:9092")
    result = materialize(
        all_assets,
        selection=AssetSelection.groups("streaming_history"),
        resources=resources_for("prod"),
        instance=DagsterInstance.ephemeral(),
        partition_key=FIRST_DAY.isoformat(),
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    message = str(failure.step_failure_data.error)
    assert "MLPLANE_FLINK_REST_URL" in message and "rest_url" not in message.replace("REST_URL", "")
