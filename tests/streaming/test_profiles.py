"""The streaming resource in each profile (no cluster needed)."""

from __future__ import annotations

import pytest
from dagster import build_resources

from engines.streaming import ClusterJob, StreamingJobError
from orchestration.profiles import resources_for


def test_prod_profile_submits_to_a_cluster_reading_kafka(prod_env, monkeypatch):
    monkeypatch.setenv("MLPLANE_KAFKA_BOOTSTRAP_SERVERS", "kafka.internal:9092")
    monkeypatch.delenv("MLPLANE_FLINK_REST_URL", raising=False)
    with build_resources(resources_for("prod")) as resources:
        assert resources.flink.mode == "cluster"
        with pytest.raises(StreamingJobError, match="MLPLANE_FLINK_REST_URL"):
            resources.flink.health("interactions")
    monkeypatch.setenv("MLPLANE_FLINK_REST_URL", "flink-jobmanager:8081")
    with build_resources(resources_for("prod")) as resources:
        job = resources.flink.job("interactions")
        assert isinstance(job, ClusterJob) and "--rest" in job.command()
        assert job.command()[job.command().index("--state-backend") + 1] == "rocksdb"
        ddl = job.spec().statements[0]
        assert "'connector' = 'kafka'" in ddl and "kafka.internal:9092" in ddl and "mlplane.interactions" in ddl


def test_local_profile_reads_the_simulators_directory(tmp_path):
    with build_resources(resources_for("local", data_dir=str(tmp_path))) as resources:
        ddl = resources.flink.job("interactions").spec().statements[0]
        assert f"'path' = '{tmp_path.resolve()}/stream/interactions'" in ddl
        assert resources.flink.health("interactions").status == "NOT_STARTED"


def test_training_data_refuses_a_job_with_live_rows(tmp_path):
    """Live rows move online values between window ends, which point-in-time training data does not
    model: building it then would skew training from serving without a word."""
    from assets.datasets import timing

    with build_resources(resources_for("local", data_dir=str(tmp_path))) as resources:
        assert timing(resources.flink).streaming_delay_seconds == 7  # 5 s watermark + a 2 s checkpoint
        live = resources.flink.model_copy(update={"live_rows": True})
        assert live.job("interactions").spec().views["item_trending"].live
        with pytest.raises(ValueError, match="live_rows is on"):
            timing(live)


def test_the_pusher_polls_faster_with_live_rows(tmp_path):
    with build_resources(resources_for("local", data_dir=str(tmp_path))) as resources:
        assert resources.flink.pusher_interval == 0.5
        assert resources.flink.model_copy(update={"live_rows": True}).pusher_interval == 0.1
        chosen = resources.flink.model_copy(update={"live_rows": True, "pusher_interval_seconds": 0.3})
        assert chosen.pusher_interval == 0.3
