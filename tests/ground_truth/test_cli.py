"""`mlplane labeling`: accounts and task progress from the command line (the label store in the lake)."""

import json

from click.testing import CliRunner

from cli.main import main
from ground_truth import accounts, queue
from ground_truth.schema import CONTENT_VIOLATION
from orchestration.profiles import resources_for


def test_add_account_and_tasks(tmp_path):
    runner = CliRunner()
    created = runner.invoke(
        main,
        [
            "labeling",
            "add-account",
            "alice",
            "--role",
            "reviewer",
            "--password",
            "long enough",
            "--data-dir",
            str(tmp_path),
        ],
    )
    assert created.exit_code == 0, created.output
    engine = resources_for("local", data_dir=str(tmp_path))["labels"].get_client()
    assert accounts.sign_in(engine, "alice", "long enough") is not None
    again = runner.invoke(
        main,
        [
            "labeling",
            "add-account",
            "alice",
            "--role",
            "admin",
            "--password",
            "long enough",
            "--data-dir",
            str(tmp_path),
        ],
    )
    assert again.exit_code != 0 and "exists" in again.output
    queue.create_task(engine, CONTENT_VIOLATION)
    listed = runner.invoke(main, ["labeling", "tasks", "--data-dir", str(tmp_path)])
    assert json.loads(listed.output.splitlines()[0])["task"] == "content_violation"
