"""`serving/prediction_logs` and `monitoring/online_accuracy` through Dagster over a lake holding what the
model server writes (its prediction log files) and the warehouse interactions that followed: the logs
pass great-expectations and land as a partition, the accuracy tables match a recomputation from the raw
rows, and a CTR drop fails the check and reaches a webhook (a local HTTP receiver standing in for the
chat relay outside the platform)."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import polars as pl
import pytest
import yaml
from dagster import AssetCheckSeverity, DagsterInstance, materialize
from PIL import Image
from polars.testing import assert_frame_equal

from assets import monitoring
from assets.monitoring import (
    COMPARISONS_TABLE,
    DROP_CHECK,
    LATENCY_CHECK,
    MODELS_TABLE,
    SRM_CHECK,
    ZONE,
    online_accuracy,
)
from assets.prediction_logs import prediction_logs
from engines.data.lake import Lake
from engines.experimentation.prediction_logs import LIVE, TABLE, config_digest, frame
from engines.experimentation.prediction_logs import ZONE as LOG_ZONE
from resources.lake import LakeResource
from resources.notifications import WebhookNotifier
from resources.quality import QualityResource
from serving.models.hooks.prediction_log import PredictionLog
from tests.engines.test_online_accuracy import T0, recompute, simulated


@pytest.fixture()
def webhook():
    received: list[dict] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", received
    server.shutdown()


def served_file(ab_split=(0.5, 0.5), arms=("control", "treatment")) -> bytes:
    """An experiments file for the simulated answers: "ab" on personalization, "other" on another model."""
    ab = [{"name": a, "model_version": str(i + 1), "traffic": t} for i, (a, t) in enumerate(zip(arms, ab_split))]
    other = [
        {"name": "a", "model_version": "1", "traffic": 1 / 3},
        {"name": "b", "model_version": "2", "traffic": 2 / 3},
    ]
    experiments = [
        {"name": "ab", "model": "personalization", "salt": "ab-salt", "variants": ab},
        {"name": "other", "model": "search", "salt": "other-salt", "variants": other},
    ]
    return yaml.safe_dump({"experiments": experiments}).encode()


def log_day(lake_root, records, config: bytes | None = None) -> None:
    """The records written as the server writes them (its writer, its files), routed with `config` (the
    server's experiments file: stored beside the logs and named by each record), or with none."""
    log = PredictionLog(lake_root, lake_root / "spill", flush_interval_s=60)
    if config is not None:
        log.keep_config(config_digest(config), config)
        records = [dataclasses.replace(r, experiments_config=config_digest(config)) for r in records]
    for record in records:
        log.submit(record)
    log.close()


def run(lake_root, day, url, **config):
    resources = {
        "lake": LakeResource(root=str(lake_root)),
        "quality": QualityResource(lake=LakeResource(root=str(lake_root))),
        "notifier": WebhookNotifier(url=url),
    }
    return materialize(
        [prediction_logs, online_accuracy],
        resources=resources,
        partition_key=day.isoformat(),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
        run_config={"ops": {"monitoring__online_accuracy": {"config": {"k": 5, "horizon_minutes": 30, **config}}}},
    )  # as the recomputation


def test_logs_are_taken_in_and_a_ctr_drop_fails_the_check_and_reaches_the_webhook(tmp_path, webhook):
    url, received = webhook
    lake = Lake(tmp_path)
    records, events = simulated(11, users=300)
    day = T0.date()
    log_day(tmp_path, records)
    lake.write_partition("warehouse", "interactions", day, events)
    before = events.with_columns(pl.col("event_timestamp") - timedelta(days=1))  # the users' week before
    lake.write_partition("warehouse", "interactions", day - timedelta(days=1), before)
    first = run(tmp_path, day, url)
    assert first.success
    taken_in = lake.read_partition(LOG_ZONE, TABLE, day)
    assert taken_in.sort("request_id", "role", "variant").equals(frame(records).sort("request_id", "role", "variant"))
    checks = {e.check_name: e.passed for e in first.get_asset_check_evaluations()}
    # no earlier day: nothing to drop from; "ab" and "other" are not in the experiments file: not tested
    assert checks == {"great_expectations": True, DROP_CHECK: True, SRM_CHECK: True, LATENCY_CHECK: True}
    stored = lake.read_partition(ZONE, MODELS_TABLE, day)
    truth = recompute(records, events)
    for row in stored.filter(pl.col("role") == LIVE).iter_rows(named=True):
        mine = [t for t in truth if t["record"].role == LIVE and t["record"].model_version == row["model_version"]]
        assert row["ctr"] == pytest.approx(sum(t["hits"] for t in mine) / sum(t["shown"] for t in mine), rel=1e-9)
    experiments = lake.read_partition(ZONE, COMPARISONS_TABLE, day)
    assert {"ab", "other", "shadow:slow"} <= set(experiments["experiment"].to_list())
    ab = experiments.filter((pl.col("experiment") == "ab") & (pl.col("metric") == "hits_per_user")).row(0, named=True)
    assert ab["looks"] == 1 and ab["variance_reduction"] > 0  # CUPED from the day before the experiment
    assert ab["cuped_difference"] != ab["difference"] and ab["p_value"] is not None
    metadata = first.asset_materializations_for_node("monitoring__online_accuracy")[0].metadata
    picture = metadata["ctr_over_time"].value  # a PNG beside the partition, inline as a Markdown image
    png = lake.partition_path(ZONE, MODELS_TABLE, day).with_name("ctr_over_time.png")
    assert picture.startswith(f"![CTR@5 per hour]({monitoring.PNG_URI}") and "<svg" not in picture
    assert base64.b64decode(picture.split(monitoring.PNG_URI)[1].split(")")[0]) == png.read_bytes()
    assert Image.open(png).format == "PNG" and metadata["answers_awaiting_outcomes"].value == 0
    assert not received

    # the next day: the same traffic, but the users stop clicking
    next_day = day + timedelta(days=1)
    later = [dataclasses.replace(r, served_at=r.served_at + timedelta(days=1)) for r in records]
    log_day(tmp_path, later)
    lake.write_partition(
        "warehouse",
        "interactions",
        next_day,
        events.filter(pl.col("event_type") == "impression").with_columns(pl.col("event_timestamp") + timedelta(days=1)),
    )
    second = run(tmp_path, next_day, url)
    pooled = lake.read_partition(ZONE, COMPARISONS_TABLE, next_day).filter(pl.col("experiment") == "ab")
    assert set(pooled["looks"].to_list()) == {2} and set(pooled["first_day"].to_list()) == {str(day)}
    assert pooled.filter(pl.col("metric") == "ctr")["control_users"][0] == ab["control_users"]  # the same users
    checks = {e.check_name: e for e in second.get_asset_check_evaluations()}
    assert checks["great_expectations"].passed and not checks[DROP_CHECK].passed
    assert checks[DROP_CHECK].metadata["notified"].value is True
    assert len(received) == 1 and received[0]["check"] == DROP_CHECK and received[0]["partition"] == str(next_day)
    assert {d["served_model"] for d in received[0]["drops"]} == {"personalization", "personalization-challenger"}


def test_a_log_that_fails_its_expectations_is_not_taken_in(tmp_path, webhook):
    url, _ = webhook
    records, events = simulated(12, users=30)
    broken = [dataclasses.replace(records[0], latency_ms=-1.0), *records[1:]]
    log_day(tmp_path, broken)
    result = run(tmp_path, T0.date(), url)
    assert not result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["great_expectations"] is False
    assert not Lake(tmp_path).partition_path(LOG_ZONE, TABLE, T0.date()).exists()


def test_a_sample_ratio_mismatch_blocks_and_its_tables_hold_no_missing_cells(tmp_path, webhook, monkeypatch):
    url, _ = webhook
    records, events = simulated(12, users=400)  # "ab" assigns users half and half; served as 90/10
    monkeypatch.setattr(monitoring, "EXPERIMENTS_FILE", tmp_path / "absent.yaml")  # never read: the logs name theirs
    log_day(tmp_path, records, served_file(ab_split=(0.9, 0.1)))
    Lake(tmp_path).write_partition("warehouse", "interactions", T0.date(), events)
    result = run(tmp_path, T0.date(), url)
    check = {e.check_name: e for e in result.get_asset_check_evaluations()}[SRM_CHECK]
    assert (
        not check.passed and check.severity == AssetCheckSeverity.ERROR and check.description.startswith("ab (day): ")
    )
    day = str(T0.date())
    srm = {(r.data["experiment"], r.data["scope"]): r.data for r in check.metadata["experiments"].value.records}
    assert srm[("ab", "day")]["mismatch"] is True and srm[("other", "day")]["mismatch"] is False
    assert srm[("ab", f"pooled {day}..{day}")]["mismatch"] is True  # the experiment's pooled days: one so far
    comparisons = Lake(tmp_path).read_partition(ZONE, COMPARISONS_TABLE, T0.date())
    marked = dict(comparisons.select("experiment", "sample_ratio_mismatch").unique().iter_rows())
    assert marked["ab"] is True and marked["other"] is False  # the online gate refuses ab's rows
    metadata = result.asset_materializations_for_node("monitoring__online_accuracy")[0].metadata
    for rows in (check.metadata["experiments"].value.records, metadata["experiments"].value.records):
        cells = [v for r in rows for v in r.data.values()]
        assert not any(v is None or (isinstance(v, float) and math.isnan(v)) for v in cells)


def test_a_live_model_over_its_latency_slo_fails_the_check_and_reaches_the_webhook(tmp_path, webhook):
    url, received = webhook
    records, events = simulated(13, users=300)
    rng = np.random.default_rng(13)
    # the challenger (v2) is slow for 3% of its answers; the shadows are slower still, and no user waits
    slowed = [
        dataclasses.replace(r, latency_ms=float(rng.uniform(600, 900)))
        if (r.role == LIVE and r.model_version == "2" and rng.random() < 0.03) or r.role != LIVE
        else r
        for r in records
    ]
    log_day(tmp_path, slowed)
    Lake(tmp_path).write_partition("warehouse", "interactions", T0.date(), events)
    result = run(tmp_path, T0.date(), url, latency_slo_p99_ms=500.0)
    check = {e.check_name: e for e in result.get_asset_check_evaluations()}[LATENCY_CHECK]
    assert not check.passed and check.severity == AssetCheckSeverity.ERROR
    breaches = [r.data for r in check.metadata["breaches"].value.records]
    assert [(b["role"], b["model_version"]) for b in breaches] == [(LIVE, "2")]
    # P99 recomputed from the raw records, as numpy interpolates it
    raw = [r.latency_ms for r in slowed if r.role == LIVE and r.model_version == "2"]
    assert breaches[0]["p99_ms"] == pytest.approx(np.percentile(raw, 99), rel=1e-4)
    assert breaches[0]["answers"] == len(raw)
    assert len(received) == 1 and received[0]["check"] == LATENCY_CHECK
    assert [b["model_version"] for b in received[0]["breaches"]] == ["2"]

    # the same day judged against a looser SLO, or with too few answers to judge a P99: no breach
    looser = run(tmp_path, T0.date(), url, latency_slo_p99_ms=float(np.max(raw)) + 1)
    assert {e.check_name: e.passed for e in looser.get_asset_check_evaluations()}[LATENCY_CHECK]
    thin = run(tmp_path, T0.date(), url, latency_minimum_answers=len(raw) + 1)
    assert {e.check_name: e.passed for e in thin.get_asset_check_evaluations()}[LATENCY_CHECK]
    assert len(received) == 1


def test_a_config_changed_after_serving_does_not_change_the_analysis(tmp_path, webhook, monkeypatch):
    """The answers were routed with "ab" as control/treatment 50/50. The repository's file later names
    treatment the control at 90/10: the analysis still reads the file the server ran. Logs that name no
    file (an older server) are read with the repository's file, and the metadata counts them."""
    url, _ = webhook
    records, events = simulated(14, users=400)
    repository = tmp_path / "repository.yaml"
    monkeypatch.setattr(monitoring, "EXPERIMENTS_FILE", repository)
    served = served_file()
    log_day(tmp_path / "lake", records, served)
    Lake(tmp_path / "lake").write_partition("warehouse", "interactions", T0.date(), events)

    def analysed(lake_root) -> tuple[dict, pl.DataFrame, dict]:
        result = run(lake_root, T0.date(), url)
        checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        metadata = result.asset_materializations_for_node("monitoring__online_accuracy")[0].metadata
        comparisons = Lake(lake_root).read_partition(ZONE, COMPARISONS_TABLE, T0.date())
        return checks, comparisons.filter(pl.col("experiment") == "ab").sort("variant", "metric"), metadata

    repository.write_bytes(served)
    checks, as_served, metadata = analysed(tmp_path / "lake")
    designs = {r.data["experiment"]: r.data for r in metadata["experiment_designs"].value.records}
    assert checks[SRM_CHECK] and set(as_served["control"]) == {"control"}
    assert (
        designs["ab"]["served_configs"] == config_digest(served)
        and designs["ab"]["split"] == "control 0.5, treatment 0.5"
    )
    assert metadata["answers_without_experiments_config"].value == 0

    repository.write_bytes(served_file(ab_split=(0.9, 0.1), arms=("treatment", "control")))
    checks, after_change, _ = analysed(tmp_path / "lake")
    assert checks[SRM_CHECK]  # the old code read the repository's file: a mismatch, and the control flipped
    assert_frame_equal(after_change, as_served, rel_tol=1e-9)  # sums in another order: the last digits

    log_day(tmp_path / "old", [dataclasses.replace(r, experiments_config=None) for r in records])
    Lake(tmp_path / "old").write_partition("warehouse", "interactions", T0.date(), events)
    checks, old, metadata = analysed(tmp_path / "old")
    assert not checks[SRM_CHECK] and set(old["control"]) == {"treatment"}  # read with the repository's file
    assert metadata["answers_without_experiments_config"].value == sum(r.role == LIVE for r in records)
