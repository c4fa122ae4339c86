"""The Dagster side on a real mini-cluster: the streaming asset starts the job through
dagster-pipes and the pusher process, live events reach online reads, and after the job is killed
the sensor posts to the webhook and requests the run that restarts it from its checkpoint.
The webhook receiver is a local HTTP server standing in for Slack (outside the platform)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from dagster import AssetKey, DagsterInstance, SensorResult, build_sensor_context, materialize

from assets.streaming import streaming_assets
from orchestration.profiles import resources_for
from orchestration.streaming import streaming_job_sensor
from resources.flink import FlinkResource
from resources.notifications import WebhookNotifier
from simulator import Simulator
from simulator.stream import EventStream
from tests.conftest import SMALL
from tests.streaming.conftest import STREAM_DAY, TIMEOUT, wait_until

KEY = AssetKey(["streaming", "interactions"])


class Webhook:
    def __init__(self):
        self.received: list[dict] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture()
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


def materialized_metadata(result) -> dict:
    [event] = result.asset_materializations_for_node("streaming__interactions")
    return {k: v.value for k, v in event.metadata.items()}


def test_asset_runs_the_job_and_the_sensor_restarts_it_after_a_kill(pipeline_dir, tmp_path, webhook):
    lake = tmp_path / "lake"
    shutil.copytree(pipeline_dir / "feature_repo", lake / "feature_repo")  # registry and batch features online
    resources = resources_for("local", data_dir=str(lake))
    flink = FlinkResource(
        feature_store=resources["feature_store"],
        slide_seconds=5,
        watermark_delay_seconds=2,
        checkpoint_interval_ms=1000,
        start_timeout_seconds=TIMEOUT,
    )
    notifier = WebhookNotifier(url=webhook.url)
    instance = DagsterInstance.ephemeral()
    try:
        started = materialize(streaming_assets, resources={"flink": flink}, instance=instance)
        meta = materialized_metadata(started)
        assert meta["status"] == "RUNNING" and meta["flink_job_id"]

        users: set[int] = set()
        stream = EventStream(Simulator(SMALL, tmp_path / "sim"), lake / "stream" / "interactions")
        # a job reads a backlog of files newest first, so feed it live only once it reads
        stream.append_lines(['{"not": "an event"}'])
        job = flink.job("interactions")
        wait_until(lambda: job.metrics()["records"] == 1, "the job to read its first file")
        stream.live(
            rate_per_second=20,
            seconds=12,
            day=STREAM_DAY,
            on_file=lambda path, at, rows: users.update(rows["user_id"].to_pylist()),
        )
        engine = resources["feature_store"].get_client()
        rows = [{"user_id": u, "item_id": 1} for u in sorted(users)[:10]]
        online = wait_until(
            lambda: (
                (r := engine.online_features("personalization_ranking", rows))
                and all(v is not None for v in r["user_activity_realtime__impressions_1h"])
                and r
            ),
            "live events in online reads",
        )
        assert any(v for v in online["user_activity_realtime__impressions_1h"])
        assert any(v is not None for v in online["user_engagement__impressions_7d"])  # batch, side by side

        wait_until(job.latest_checkpoint, "a checkpoint")
        os.killpg(job.status()["pid"], signal.SIGKILL)
        resources = {"flink": flink, "notifier": notifier}
        with build_sensor_context(resources=resources, instance=instance) as context:
            tick = wait_until(lambda: isinstance(r := streaming_job_sensor(context), SensorResult) and r, "the sensor")
        [request] = tick.run_requests
        assert request.asset_selection == [KEY]
        assert webhook.received[-1]["status"] == "DIED" and "restarting" in webhook.received[-1]["action"]
        with build_sensor_context(resources=resources, instance=instance, cursor=tick.cursor) as context:
            again = streaming_job_sensor(context)
        assert not getattr(again, "run_requests", None) and len(webhook.received) == 1  # one incident, one post

        restarted = materialize(streaming_assets, resources={"flink": flink}, instance=instance)  # the requested run
        meta = materialized_metadata(restarted)
        assert meta["status"] == "RUNNING" and "/chk-" in meta["restored_from"]
        assert flink.health("interactions").healthy
    finally:
        flink.stop("interactions")
    time.sleep(0.5)
    assert not flink.health("interactions").healthy
