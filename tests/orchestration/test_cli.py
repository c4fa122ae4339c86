"""The `mlplane` CLI, as a new user runs it: the demo of the README, fault injection, online reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from orchestration.profiles import PROJECT_ROOT

pytestmark = pytest.mark.services  # `mlplane` subprocesses running the pipeline

MLPLANE = str(Path(sys.executable).with_name("mlplane"))


def run(args, env, timeout=600):
    out = subprocess.run([MLPLANE, *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def test_demo_simulates_materializes_and_reports(tmp_path):
    # hourly streaming windows keep the Flink backfill of the history short in this test
    env = {
        **os.environ,
        "MLPLANE_DATA_DIR": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(tmp_path / "home"),
        "MLPLANE_STREAMING_SLIDE_SECONDS": "3600",
    }
    out = run(["demo", "--days", "2", "--scale", "0.2"], env)

    produced = {
        t: (int(p), int(r.replace(",", "")))
        for t, p, r in re.findall(r"^\s+(\w+/\w+)\s+(\d+) partitions\s+([\d,]+) rows$", out, re.M)
    }
    assert {
        "warehouse/interactions",
        "offline/user_engagement",
        "datasets/personalization_training",
        "streaming_history/item_sales_today",
    } <= set(produced)
    assert produced["warehouse/interactions"][0] == 2
    # the last day's training set waits for the next day's interactions (its labels look past midnight)
    partitions, rows = produced["datasets/personalization_training"]
    assert partitions == 1 and rows > 100
    report = Path(re.search(r"Data-quality report: (\S+)", out).group(1))
    assert report.exists() and "mlplane" in report.read_text()
    assert "mlplane ui" in out
    # two days give one training day: the training run fails for want of history and nothing is served
    # (the README test runs the default four days through training, batch inference and a recommendation)
    assert "6/8 to 8/8 skipped: no champion to serve" in out
    # CLIP, embeddings and a search for an item's own title; a labeling round through the app
    hits = re.search(r'mlplane search "[^"]+": item (\d+) .*top 3:\n((?:\s+\d+\s+[\d.]+\s+.+\n){3})', out)
    assert hits, out[-3000:]
    assert int(re.search(r"(\d+) answers by 4 simulated annotators", out).group(1)) > 0
    released = re.search(r"release v0001: (\d+) items", out)
    assert released or "no release: its checks refused the labels" in out  # 99% annotators, a few violations

    instance = DagsterInstance.from_config(str(tmp_path / "home"))
    try:
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
        assert {r.job_name for r in runs} >= {
            "daily_pipeline",
            "streaming_backfill",
            "training_data",
            "feature_store_refresh",
            "item_embeddings_daily",
            "ground_truth_queues",
            "__ASSET_JOB",  # clip_model and the release, as `dagster asset materialize` runs them
        }
        # data (5), CLIP, embeddings, queues, the release and the flags from it (a refused release: 4)
        assert len(runs) == (10 if released else 8)
    finally:
        instance.dispose()

    values = json.loads(run(["features", "get", "search", "--entity", "item_id=3"], env))
    assert values["item_id"] == 3 and values["item_content__category"]

    wrote = run(["inject", "malformed", "--date", _last_day(tmp_path), "--kind", "bad_json"], env)
    assert "malformed-bad_json.jsonl" in wrote


def _last_day(tmp_path: Path) -> str:
    days = sorted(p.name.removeprefix("date=") for p in (tmp_path / "lake" / "landing" / "interactions").iterdir())
    return days[-1]


def test_ui_starts_without_an_activated_environment(tmp_path):
    """`.venv/bin/mlplane ui` with no .venv/bin on PATH, as the README says to run it."""
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",
        "DAGSTER_HOME": str(tmp_path / "home"),
        "MLPLANE_DATA_DIR": str(tmp_path / "lake"),
    }
    ui = subprocess.Popen(
        [MLPLANE, "ui", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and ui.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert ui.poll() is None, ui.stdout.read()[-3000:]
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
        assert info["dagster_webserver_version"]
    finally:
        os.killpg(ui.pid, signal.SIGKILL)
        ui.wait()
