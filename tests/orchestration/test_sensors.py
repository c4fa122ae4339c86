from __future__ import annotations

import json
import threading
from datetime import date
from http.server import BaseHTTPRequestHandler, HTTPServer

from dagster import (
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    build_run_status_sensor_context,
    build_sensor_context,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from orchestration.definitions import defs
from orchestration.sensors import landing_sensor, notify_run_failure
from resources.lake import LakeResource
from resources.notifications import WebhookNotifier
from tests.conftest import FIRST_DAY, run_pipeline, simulate


def evaluate(sensor, data_dir, cursor=None):
    with build_sensor_context(cursor=cursor, resources={"lake": LakeResource(root=str(data_dir))},
                              repository_def=defs.get_repository_def()) as context:
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
        result = run_pipeline(tmp_path, FIRST_DAY, FIRST_DAY, AssetSelection.groups("ingestion"),
                              instance=instance, raise_on_error=False)
        assert not result.success
        [failure] = instance.fetch_run_status_changes(DagsterEventType.RUN_FAILURE, limit=1).records
        context = build_run_status_sensor_context(
            sensor_name=notify_run_failure.name,
            dagster_event=failure.event_log_entry.dagster_event,
            dagster_instance=instance,
            dagster_run=instance.get_run_by_id(result.run_id),
            resources={"notifier": WebhookNotifier(url=f"http://127.0.0.1:{server.server_port}/hook")},
        ).for_run_failure()
        notify_run_failure(context)
    finally:
        server.shutdown()
    [payload] = _Recorder.received
    assert payload["run_id"] == result.run_id
    assert payload["job"] == instance.get_run_by_id(result.run_id).job_name
    assert "warehouse__interactions" in payload["error"]  # names the failed step
    assert result.run_id[:8] in payload["text"]
