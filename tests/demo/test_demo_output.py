"""What the demo prints for a run it expects may be refused: one line naming the check, not a stack trace."""

from __future__ import annotations

from dagster import AssetCheckResult, AssetCheckSpec, DagsterInstance, MaterializeResult, asset, materialize

from demo.walkthrough import refusal


@asset(check_specs=[AssetCheckSpec("beats_champion", asset="toy", blocking=True)])
def toy():
    yield MaterializeResult()
    yield AssetCheckResult(check_name="beats_champion", passed=False)


@asset
def broken():
    raise RuntimeError("the registry is unreachable\nsecond line of detail")


def test_a_refused_run_is_one_line_naming_its_check():
    with DagsterInstance.ephemeral() as instance:
        result = materialize([toy], instance=instance, raise_on_error=False)
    assert not result.success
    assert refusal(result) == "refused by toy beats_champion: it stays a challenger"


def test_a_run_that_failed_otherwise_says_its_error_not_a_refusal():
    with DagsterInstance.ephemeral() as instance:
        result = materialize([broken], instance=instance, raise_on_error=False)
    assert refusal(result) == "failed: RuntimeError: the registry is unreachable"
