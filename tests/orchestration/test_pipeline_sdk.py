"""The training-pipeline SDK's run tags (priority class, notification targets, GPUs) and what the
production run queue and the failure sensor do with them."""

from __future__ import annotations

import pytest
import yaml
from dagster import DagsterRun, DailyPartitionsDefinition

from assets.pipelines import PRIORITY_CLASSES, TrainedModel, TrainingRun, training_pipeline
from orchestration.dagster_internals import TagConcurrencyLimitsCounter
from orchestration.profiles import PROJECT_ROOT, notify_targets


def toy_pipeline(**options):
    @training_pipeline(
        "toy",
        description="A toy model for the SDK's tests",
        deps=[],
        partitions_def=DailyPartitionsDefinition(start_date="2026-01-01"),
        **options,
    )
    def train_toy(run: TrainingRun) -> TrainedModel:
        raise NotImplementedError

    return train_toy


def test_priority_class_notify_targets_and_gpus_become_run_tags():
    job = toy_pipeline(priority="high", notify=("ml-oncall", "search-team"), pool="gpu", gpus=2).job
    assert job.tags["dagster/priority"] == str(PRIORITY_CLASSES["high"]) == "50"
    assert job.tags["mlplane/notify"] == "ml-oncall,search-team"
    assert (job.tags["mlplane/pool"], job.tags["mlplane/gpus"]) == ("gpu", "2")
    assert toy_pipeline().job.tags["dagster/priority"] == "0" and "mlplane/notify" not in toy_pipeline().job.tags


def test_an_unknown_priority_class_or_gpus_off_the_gpu_pool_is_refused():
    with pytest.raises(ValueError, match="priority must be one of critical, high, normal, low, backfill"):
        toy_pipeline(priority="urgent")
    with pytest.raises(ValueError, match="needs pool='gpu'"):
        toy_pipeline(gpus=1)


def test_the_production_run_queue_limits_runs_by_their_gpus():
    config = yaml.safe_load((PROJECT_ROOT / "deploy" / "prod" / "dagster.yaml").read_text())
    limits = config["run_coordinator"]["config"]["tag_concurrency_limits"]

    def run(gpus: int) -> DagsterRun:
        return DagsterRun(job_name="train_toy", tags=toy_pipeline(pool="gpu", gpus=gpus).job.tags)

    def blocked(running: list[int], candidate: int) -> bool:
        counter = TagConcurrencyLimitsCounter(limits, [run(g) for g in running])
        return counter.is_blocked(run(candidate))

    assert not blocked([1, 1, 1], 1) and blocked([1, 1, 1, 1], 1)
    assert not blocked([2], 2) and blocked([2, 2], 2)
    assert not blocked([], 4) and blocked([4], 4)
    assert blocked([1, 1, 2, 4], 1)  # the GPU pool holds four runs
    cpu = DagsterRun(job_name="daily_pipeline", tags={"mlplane/pool": "cpu"})
    assert not TagConcurrencyLimitsCounter(limits, [run(4), run(2), run(2)]).is_blocked(cpu)


def test_notify_targets_come_from_named_environment_variables(monkeypatch):
    monkeypatch.setenv("MLPLANE_NOTIFY_ML_ONCALL", "http://127.0.0.1:9/oncall")
    monkeypatch.setenv("MLPLANE_NOTIFY_EMPTY", "")
    assert notify_targets() == {"ml-oncall": "http://127.0.0.1:9/oncall"}


def test_a_failed_run_reaches_its_pipelines_notification_targets(tmp_path):
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from dagster import AssetSelection, DagsterInstance, materialize

    from assets import all_assets
    from orchestration.profiles import resources_for
    from orchestration.sensors import notify_run_failure
    from resources.notifications import WebhookNotifier
    from tests.conftest import run_failure_context

    received: list[tuple[str, dict]] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        instance = DagsterInstance.ephemeral()
        result = materialize(
            all_assets,
            selection=AssetSelection.assets(["warehouse", "interactions"]),
            resources=resources_for("local", data_dir=str(tmp_path)),
            instance=instance,
            partition_key="2026-01-01",
            raise_on_error=False,
            tags={"mlplane/notify": "ml-oncall,nobody"},
        )  # nothing landed: it fails
        assert not result.success
        context = run_failure_context(
            instance, result.run_id, WebhookNotifier(url=f"{base}/default", targets={"ml-oncall": f"{base}/oncall"})
        )
        notify_run_failure(context)
    finally:
        server.shutdown()
    assert sorted(path for path, _ in received) == ["/default", "/oncall"]  # "nobody" has no webhook: logged
    assert all(payload["run_id"] == result.run_id for _, payload in received)
