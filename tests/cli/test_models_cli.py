"""`mlplane models promote`: moving an alias by hand, past the gate, records who and why on the version,
and `mlplane models list` shows it."""

from __future__ import annotations

import getpass

import pytest
from click.testing import CliRunner

from cli.main import main
from tests.engines.test_model_export import build_registry


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """personalization v1 champion, v2 challenger (the gate left it there)."""
    root = tmp_path_factory.mktemp("lake")
    build_registry(root)
    return root


def models(lake, *args):
    return CliRunner().invoke(main, ["models", *args, "--data-dir", str(lake)])


def test_promote_moves_the_champion_and_records_who_and_why(lake):
    promoted = models(lake, "promote", "personalization", "2", "--reason", "INC-42: v1 leaks", "--by", "alice")
    assert promoted.exit_code == 0, promoted.output
    assert "personalization champion: v1 -> v2" in promoted.output

    listed = models(lake, "list", "--model", "personalization").output.splitlines()
    [v2] = [line for line in listed if line.startswith("v2 ")]
    assert "[challenger,champion]" in v2
    assert '"promoted.champion.by": "alice"' in v2 and '"promoted.champion.reason": "INC-42: v1 leaks"' in v2
    [v1] = [line for line in listed if line.startswith("v1 ")]
    assert "champion" not in v1 and "promoted" not in v1

    rolled = models(lake, "rollback", "--reason", "back to v1 after all")  # the history knows v1 held it
    assert rolled.exit_code == 0 and "v2 -> v1" in rolled.output


def test_promote_records_the_os_user_by_default(lake):
    promoted = models(lake, "promote", "clip", "1", "--alias", "staging", "--reason", "smoke test")
    assert promoted.exit_code == 0 and "clip staging: none -> v1" in promoted.output
    listed = models(lake, "list", "--model", "clip").output
    assert f'"promoted.staging.by": "{getpass.getuser()}"' in listed


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["personalization", "9", "--reason", "why"], "personalization has no version 9"),
        (["nosuchmodel", "1", "--reason", "why"], "no registered model named 'nosuchmodel'"),
        (["personalization", "2", "--reason", "  "], "a promotion needs a reason"),
        (["personalization", "2"], "Missing option '--reason'"),
    ],
)
def test_promote_refuses_what_it_cannot_record(lake, args, error):
    result = models(lake, "promote", *args)
    assert result.exit_code != 0 and error in result.output
