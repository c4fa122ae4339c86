"""Notifications whose target is optional: in the prod profile, an unset MLPLANE_WEBHOOK_URL (or model
server) makes the sensors skip or log, never error on every tick."""

from __future__ import annotations

import logging

from dagster import (
    AssetSelection,
    DagsterInstance,
    SkipReason,
    build_sensor_context,
)

from orchestration.profiles import resources_for
from orchestration.sensors import model_export_sensor, notify_run_failure
from orchestration.streaming import streaming_job_sensor
from tests.conftest import FIRST_DAY, run_failure_context, run_pipeline


def test_a_failed_run_without_a_webhook_is_logged_not_an_error(prod_env, monkeypatch, tmp_path, capfd):
    monkeypatch.delenv("MLPLANE_WEBHOOK_URL")
    instance = DagsterInstance.ephemeral()
    result = run_pipeline(
        tmp_path / "lake", FIRST_DAY, FIRST_DAY, AssetSelection.groups("ingestion"), instance, raise_on_error=False
    )
    context = run_failure_context(instance, result.run_id, resources_for("prod")["notifier"])
    notify_run_failure(context)  # raised DagsterInvalidConfigError on every tick before
    assert f"run {result.run_id} failed; no webhook configured (set MLPLANE_WEBHOOK_URL)" in capfd.readouterr().err


def test_streaming_sensor_skips_without_a_flink_cluster_or_webhook(prod_env, monkeypatch):
    monkeypatch.delenv("MLPLANE_WEBHOOK_URL")
    monkeypatch.delenv("MLPLANE_FLINK_REST_URL", raising=False)
    with build_sensor_context(resources=resources_for("prod")) as context:
        result = streaming_job_sensor(context)
    assert isinstance(result, SkipReason) and "MLPLANE_FLINK_REST_URL" in result.skip_message


def test_model_export_sensor_skips_without_a_model_server(prod_env, monkeypatch):
    monkeypatch.delenv("MLPLANE_MODEL_SERVER_URL")
    with build_sensor_context(resources=resources_for("prod")) as context:
        result = model_export_sensor(context)
    assert isinstance(result, SkipReason) and "MLPLANE_MODEL_SERVER_URL" in result.skip_message


def test_an_unset_webhook_is_one_warning_at_start(prod_env, monkeypatch, caplog):
    from orchestration.profiles import warn_about_unset_notifications

    monkeypatch.delenv("MLPLANE_WEBHOOK_URL")
    with caplog.at_level(logging.WARNING):
        warn_about_unset_notifications("prod")
        warn_about_unset_notifications("prod")
    assert caplog.text.count("MLPLANE_WEBHOOK_URL is not set") == 1
    caplog.clear()
    warn_about_unset_notifications("local")
    assert "MLPLANE_WEBHOOK_URL" not in caplog.text  # the embedded default has no one to tell
