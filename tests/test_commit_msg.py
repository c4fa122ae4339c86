"""The commit-msg hook that scripts/setup installs: it refuses what the project's commit rule forbids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HOOK = Path(__file__).parents[1] / "scripts" / "git-hooks" / "commit-msg"


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([sys.executable, HOOK, path], capture_output=True, text=True)


@pytest.mark.parametrize(
    "message",
    [
        "Gate: clear approved when the check fails\n\nA refused version kept the alias (seen in the demo).\n",
        "Short subject\n\nwhy\n# Please enter the commit message\n",
        "Merge branch 'stats'\n",
        "Subject\n\nBody.\n# ------------------------ >8 ------------------------\n" + "x" * 200 + "\n",
    ],
)
def test_a_well_formed_message_passes(tmp_path, message):
    assert run_hook(tmp_path, message).returncode == 0


@pytest.mark.parametrize(
    "message, problem",
    [
        ("x" * 73 + "\n\nbody\n", "73 characters"),
        ("Subject without a body\n", "a body must follow"),
        ("Subject\nbody on the second line\n", "a body must follow"),
        ("Subject\n\n\n# only comments\n", "a body must follow"),
        ("\nSubject\n\nbody\n", "empty or starts with a blank line"),
    ],
)
def test_a_message_against_the_rule_is_refused_with_the_reason(tmp_path, message, problem):
    result = run_hook(tmp_path, message)
    assert result.returncode == 1
    assert problem in result.stderr


def test_setup_installs_the_hook():
    setup = (HOOK.parents[1] / "setup").read_text()
    assert "core.hooksPath scripts/git-hooks" in setup
