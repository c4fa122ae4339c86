"""The setup scripts keep install output in build/*.log: one line on the terminal per environment, the
log's last lines when a step fails."""

from __future__ import annotations

import subprocess
from pathlib import Path

COMMON = Path(__file__).parents[1] / "scripts" / "setup-common.sh"


def logged(tmp_path: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"source {COMMON}; logged step {command}"], cwd=tmp_path, capture_output=True, text=True
    )


def test_a_step_that_succeeds_prints_nothing_and_logs_its_output(tmp_path):
    result = logged(tmp_path, "echo 'Setting up chromium'")
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    assert "Setting up chromium" in (tmp_path / "build" / "step.log").read_text()


def test_a_step_that_fails_says_why_from_its_log(tmp_path):
    result = logged(tmp_path, "sh -c 'echo E: Unable to locate package >&2; exit 100'")
    assert result.returncode == 100
    assert "failed (100)" in result.stderr and "E: Unable to locate package" in result.stderr
    assert "build/step.log" in result.stderr


def test_no_install_writes_to_the_terminal():
    scripts = COMMON.parent
    for name in ("setup", "setup-flink", "setup-vllm"):
        for line in (scripts / name).read_text().splitlines():
            if "pip install" in line or "apt-get install" in line:
                assert "logged " in line or ">>build/" in line, (name, line)
