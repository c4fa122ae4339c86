"""The sensor that watches the streaming jobs: a failed or vanished job is reported to the webhook
and restarted from its newest checkpoint by a run of its asset. After `MAX_RESTARTS` failures in a
row without a healthy tick it stops restarting and says so, so a job never flaps silently."""

from __future__ import annotations

import json

from dagster import (
    AssetSelection,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.streaming import streaming_key
from engines.streaming import streaming_sources
from resources.flink import FlinkResource
from resources.notifications import WebhookNotifier

MAX_RESTARTS = 3


@sensor(
    asset_selection=AssetSelection.groups("streaming"),
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Checks every streaming Flink job; a failed or killed job is posted to the webhook and "
    f"restarted from its checkpoint (at most {MAX_RESTARTS} times in a row).",
)
def streaming_job_sensor(context: SensorEvaluationContext, flink: FlinkResource, notifier: WebhookNotifier):
    if missing := flink.missing_setting():
        return SkipReason(f"no streaming jobs to watch: {missing}")
    cursor: dict = json.loads(context.cursor) if context.cursor else {}
    requests, notes = [], []
    for source in streaming_sources():
        health = flink.health(source)
        seen = cursor.get(source, {"restarts": 0, "incident": None})
        if health.healthy or health.status == "NOT_STARTED":
            cursor[source] = {"restarts": 0, "incident": None}
            continue
        incident = f"{health.job_id}:{health.pid}:{health.status}"
        if incident == seen["incident"]:
            continue  # already handled; its restart run is queued or running
        giving_up = seen["restarts"] >= MAX_RESTARTS
        action = "not restarting: too many failures in a row" if giving_up else "restarting from the newest checkpoint"
        payload = {
            "text": f"mlplane streaming job {health.name} is {health.status}: {health.error}; {action}",
            "job": health.name,
            "status": health.status,
            "error": health.error,
            "checkpoint": health.checkpoint,
            "flink_job_id": health.job_id,
            "log_dir": health.log_dir,
            "action": action,
        }
        if not notifier.post(payload):
            context.log.warning(payload["text"] + " (no webhook configured: set MLPLANE_WEBHOOK_URL)")
        notes.append(payload["text"])
        cursor[source] = {"restarts": seen["restarts"] + (0 if giving_up else 1), "incident": incident}
        if not giving_up:
            requests.append(
                RunRequest(
                    run_key=f"restart:{source}:{incident}",
                    asset_selection=[streaming_key(source)],
                    tags={"mlplane/restart_of": health.job_id or ""},
                )
            )
    if not requests and not notes:
        return SkipReason("every streaming job is running (or not started)")
    return SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))
