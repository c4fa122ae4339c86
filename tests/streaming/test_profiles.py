"""The streaming resource in each profile (no cluster needed)."""

from __future__ import annotations

import pytest
from dagster import build_resources

from engines.streaming import StreamingJobError
from orchestration.profiles import resources_for


def test_prod_profile_submits_to_a_cluster_reading_kafka(prod_env, monkeypatch):
    monkeypatch.setenv("MLPLANE_KAFKA_BOOTSTRAP_SERVERS", "kafka.internal:9092")
    with build_resources(resources_for("prod")) as resources:
        flink = resources.flink
        assert flink.mode == "cluster"
        ddl = flink.job("interactions").spec().statements[0]
        assert "'connector' = 'kafka'" in ddl and "kafka.internal:9092" in ddl and "mlplane.interactions" in ddl
        with pytest.raises(StreamingJobError, match="sql_gateway_url and rest_url"):
            flink.health("interactions")


def test_local_profile_reads_the_simulators_directory(tmp_path):
    with build_resources(resources_for("local", data_dir=str(tmp_path))) as resources:
        ddl = resources.flink.job("interactions").spec().statements[0]
        assert f"'path' = '{tmp_path.resolve()}/stream/interactions'" in ddl
        assert resources.flink.health("interactions").status == "NOT_STARTED"
