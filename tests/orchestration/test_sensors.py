from __future__ import annotations

import json
import threading
from datetime import date, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from dagster import (
    AssetSelection,
    DagsterInstance,
    build_sensor_context,
)

from orchestration.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from orchestration.definitions import defs
from orchestration.sensors import landing_sensor, notify_run_failure
from resources.lake import LakeResource
from resources.notifications import WebhookNotifier
from tests.conftest import FIRST_DAY, run_failure_context, run_pipeline, simulate


def evaluate(sensor, data_dir, cursor=None):
    with build_sensor_context(
        cursor=cursor, resources={"lake": LakeResource(root=str(data_dir))}, repository_def=defs.get_repository_def()
    ) as context:
        return sensor.evaluate_tick(context)


def requested_days(result) -> tuple[str, str]:
    [request] = result.run_requests
    if request.partition_key:
        return request.partition_key, request.partition_key
    return request.tags[ASSET_PARTITION_RANGE_START_TAG], request.tags[ASSET_PARTITION_RANGE_END_TAG]


def test_landing_sensor_runs_landed_days_and_reruns_from_a_late_file_onwards(tmp_path):
    sim = simulate(tmp_path, days=3)
    first = evaluate(landing_sensor, tmp_path)
    assert requested_days(first) == ("2026-01-01", "2026-01-03")  # one run, in order

    again = evaluate(landing_sensor, tmp_path, first.cursor)
    assert again.run_requests == [] and again.skip_message

    sim.write_late_file(date(2026, 1, 2), "interactions")
    late = evaluate(landing_sensor, tmp_path, first.cursor)
    # day 3's 7- and 30-day windows include day 2, so it is recomputed too
    assert requested_days(late) == ("2026-01-02", "2026-01-03")
    assert late.run_requests[0].run_key != first.run_requests[0].run_key

    sim.write_day(date(2026, 1, 4))
    newest = evaluate(landing_sensor, tmp_path, late.cursor)
    assert newest.run_requests[0].partition_key == "2026-01-04"


def test_landing_sensor_waits_until_every_stream_has_landed(tmp_path):
    simulate(tmp_path, days=1)
    for f in (tmp_path / "landing" / "abuse_reports" / "date=2026-01-01").iterdir():
        f.unlink()
    result = evaluate(landing_sensor, tmp_path)
    assert result.run_requests == []


class _Recorder(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Recorder.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_failed_run_notification_reaches_the_webhook(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        instance = DagsterInstance.ephemeral()
        # nothing has landed: ingestion fails with a clear error
        result = run_pipeline(
            tmp_path, FIRST_DAY, FIRST_DAY, AssetSelection.groups("ingestion"), instance=instance, raise_on_error=False
        )
        assert not result.success
        context = run_failure_context(
            instance, result.run_id, WebhookNotifier(url=f"http://127.0.0.1:{server.server_port}/hook")
        )
        notify_run_failure(context)
    finally:
        server.shutdown()
    [payload] = _Recorder.received
    assert payload["run_id"] == result.run_id
    assert payload["job"] == instance.get_run_by_id(result.run_id).job_name
    assert "warehouse__interactions" in payload["error"]  # names the failed step
    assert result.run_id[:8] in payload["text"]


@pytest.mark.services  # loads workspace.yaml's code location in a gRPC server, as `mlplane ui` does
def test_the_demo_leaves_the_landing_sensor_at_the_days_it_ran(tmp_path, monkeypatch):
    from demo.walkthrough import remember_landed_days
    from orchestration.dagster_internals import WorkspaceFileTarget, WorkspaceProcessContext
    from orchestration.profiles import PROJECT_ROOT

    lake_dir, home = tmp_path / "lake", tmp_path / "home"
    sim = simulate(lake_dir, days=2)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    home.mkdir()
    (home / "dagster.yaml").write_text((PROJECT_ROOT / "dagster.yaml").read_text())
    remember_landed_days(lake_dir, FIRST_DAY, FIRST_DAY + timedelta(days=1))

    # the sensor as the daemon of `dagster dev -w workspace.yaml` sees it: still running, cursor set
    with (
        DagsterInstance.get() as instance,
        WorkspaceProcessContext(instance, WorkspaceFileTarget([str(PROJECT_ROOT / "workspace.yaml")])) as workspace,
    ):
        location = workspace.create_request_context().get_code_location("mlplane")
        [repository] = location.get_repositories().values()
        remote = repository.get_sensor(landing_sensor.name)
        state = remote.get_current_instigator_state(
            instance.get_instigator_state(remote.get_remote_origin_id(), remote.selector_id)
        )
    assert state.is_running
    cursor = state.instigator_data.cursor
    assert set(json.loads(cursor)) == {"2026-01-01", "2026-01-02"}

    assert evaluate(landing_sensor, lake_dir, cursor).run_requests == []  # nothing runs again
    sim.write_late_file(date(2026, 1, 2), "interactions")
    assert requested_days(evaluate(landing_sensor, lake_dir, cursor)) == ("2026-01-02", "2026-01-02")
