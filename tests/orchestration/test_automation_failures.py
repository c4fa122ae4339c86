"""Failures of the automation itself reach people: a sensor or schedule whose ticks raise and a Dagster
daemon that reports errors are posted to the webhooks once when they start failing and once when they
recover, never once per tick.

The webhooks are a local HTTP receiver: it stands in for Slack or Teams, which are outside the platform
and cannot be reached from the test machines. The ticks are made by Dagster's own sensor and scheduler
daemon iterations over a real (SQLite) instance, with the clock moved on between them."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

from dagster import SensorResult, SkipReason, build_sensor_context, instance_for_test

from orchestration.dagster_internals import (
    DaemonHeartbeat,
    InProcessCodeLocationOrigin,
    InProcessWorkspaceLoadTarget,
    LoadableTargetOrigin,
    SerializableErrorInfo,
    create_test_daemon_workspace_context,
    execute_sensor_iteration,
    freeze_time,
    launch_scheduled_runs,
)
from orchestration.profiles import PROJECT_ROOT, notifier
from orchestration.sensors import automation_failure_sensor


class Receiver(BaseHTTPRequestHandler):
    """Records each POST as (path, JSON body); answers `status` (a webhook that is down answers 503)."""

    received: list[tuple[str, dict]] = []
    status = 204

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if Receiver.status < 400:
            Receiver.received.append((self.path, json.loads(body)))
        self.send_response(Receiver.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def webhook_receiver(monkeypatch):
    Receiver.received, Receiver.status = [], 204
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv("MLPLANE_WEBHOOK_URL", f"{base}/default")
    monkeypatch.setenv("MLPLANE_NOTIFY_ML_ONCALL", f"{base}/oncall")
    try:
        yield Receiver
    finally:
        server.shutdown()


def messages(status: str, name: str) -> list[str]:
    return [path for path, body in Receiver.received if body["status"] == status and body["name"] == name]


def daemon_ticks(workspace, start: datetime, count: int) -> None:
    """`count` iterations of the sensor and scheduler daemons, 70 s apart (past every minimum interval)."""
    logger = logging.getLogger("test_daemon")
    for i in range(count):
        now = start + timedelta(seconds=70 * i)
        with freeze_time(now):
            list(launch_scheduled_runs(workspace, logger, now, iteration_times={}))
            list(execute_sensor_iteration(workspace, logger, threadpool_executor=None, submit_threadpool_executor=None))


def test_a_failing_sensor_and_schedule_are_posted_once_and_their_recovery_once(monkeypatch, tmp_path):
    broken = tmp_path / "broken"
    broken.touch()
    monkeypatch.setenv("MLPLANE_TEST_BREAK", str(broken))
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(
            executable_path=sys.executable,
            module_name="tests.orchestration.failing_automation",
            working_directory=str(PROJECT_ROOT),
        ),
        location_name="failing_automation",
    )
    start = datetime(2026, 12, 7, 12, 0, 30, tzinfo=UTC)
    with (
        webhook_receiver(monkeypatch),
        instance_for_test() as instance,
        create_test_daemon_workspace_context(InProcessWorkspaceLoadTarget(origin), instance) as workspace,
    ):
        daemon_ticks(workspace, start, count=5)
        # the webhook of every failure, and the job's notify= target: once each, not once per tick
        assert sorted(messages("failing", "flaky_sensor")) == ["/default", "/oncall"]
        assert sorted(messages("failing", "flaky_schedule")) == ["/default", "/oncall"]
        [(_, sensor_message)] = [(p, b) for p, b in Receiver.received if b["name"] == "flaky_sensor"][:1]
        assert sensor_message["error"] == "RuntimeError: the landing folder is unreachable"
        assert "flaky_sensor is failing" in sensor_message["text"]
        assert messages("recovered", "flaky_sensor") == []

        broken.unlink()
        daemon_ticks(workspace, start + timedelta(minutes=10), count=3)
        assert sorted(messages("recovered", "flaky_sensor")) == ["/default", "/oncall"]
        assert sorted(messages("recovered", "flaky_schedule")) == ["/default", "/oncall"]
        assert len(messages("failing", "flaky_sensor")) == 2  # none more
        # the failure sensor never reports on itself, and never failed
        assert not [b for _, b in Receiver.received if b["name"] == automation_failure_sensor.name]


def heartbeat(instance, errors: list[str]) -> None:
    infos = [SerializableErrorInfo(message=e, stack=[], cls_name="Exception") for e in errors]
    instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "QUEUED_RUN_COORDINATOR", "d1", infos))


def evaluate(instance, cursor: str | None):
    with build_sensor_context(
        instance=instance, cursor=cursor, resources={"notifier": notifier()}, sensor_name=automation_failure_sensor.name
    ) as context:
        return automation_failure_sensor(context)


def test_daemon_errors_are_posted_and_a_webhook_that_is_down_is_retried(monkeypatch):
    with webhook_receiver(monkeypatch), instance_for_test() as instance:
        heartbeat(instance, ["could not launch run 1234: no such code location"])
        Receiver.status = 503  # the webhook is down: the sensor stays green, and posts on a later tick
        result = evaluate(instance, None)
        assert isinstance(result, SensorResult) and json.loads(result.cursor) == {}
        Receiver.status = 204
        result = evaluate(instance, result.cursor)
        [(path, body)] = Receiver.received
        assert path == "/default" and body["kind"] == "daemon" and body["status"] == "failing"
        assert body["error"] == "could not launch run 1234: no such code location"

        heartbeat(instance, ["could not launch run 5678: no such code location"])  # still failing
        assert isinstance(again := evaluate(instance, result.cursor), SkipReason)
        assert "already reported" in again.skip_message and len(Receiver.received) == 1

        heartbeat(instance, [])
        evaluate(instance, result.cursor)
        assert [b["status"] for _, b in Receiver.received] == ["failing", "recovered"]


def test_without_a_webhook_a_failure_is_logged_once_and_the_sensor_stays_green(monkeypatch, capfd):
    monkeypatch.delenv("MLPLANE_WEBHOOK_URL", raising=False)
    with instance_for_test() as instance:
        heartbeat(instance, ["the run queue is stuck"])
        first = evaluate(instance, None)
        assert isinstance(first, SensorResult)
        assert isinstance(evaluate(instance, first.cursor), SkipReason)
    logged = capfd.readouterr().err
    assert logged.count("QUEUED_RUN_COORDINATOR is failing: the run queue is stuck") == 1
    assert "set MLPLANE_WEBHOOK_URL" in logged
