"""Ingestion through Dagster: quarantine keeps the day loading; the quality gate keeps bad data out."""

from __future__ import annotations

import polars as pl
from dagster import AssetCheckKey, AssetKey, AssetSelection, DagsterInstance

from engines.data.lake import Lake
from tests.conftest import FIRST_DAY, run_pipeline, simulate

INGESTION = AssetSelection.groups("ingestion")
INTERACTIONS = AssetKey(["warehouse", "interactions"])


def check_result(result, name):
    [evaluation] = [
        e for e in result.get_asset_check_evaluations() if e.asset_check_key == AssetCheckKey(INTERACTIONS, name)
    ]
    return evaluation


def test_malformed_file_is_quarantined_and_the_run_succeeds_with_a_warning(tmp_path):
    sim = simulate(tmp_path, days=1)
    bad = sim.write_malformed_file(FIRST_DAY, "interactions", "missing_column")
    result = run_pipeline(tmp_path, FIRST_DAY, FIRST_DAY, INGESTION)
    assert result.success
    warning = check_result(result, "no_quarantined_files")
    assert not warning.passed
    quarantined = warning.metadata["quarantined_files"].value.records
    assert quarantined[0].data["file"] == bad.name
    assert "missing column(s) user_id" in quarantined[0].data["problem"]
    loaded = Lake(tmp_path).read_partition("warehouse", "interactions", FIRST_DAY)
    assert loaded.height > 1000 and not loaded.get_column("event_id").str.contains("-bad-").any()


def test_quality_gate_blocks_bad_rows_and_keeps_the_previous_partition(tmp_path):
    simulate(tmp_path, days=1)
    instance = DagsterInstance.ephemeral()
    run_pipeline(tmp_path, FIRST_DAY, FIRST_DAY, INGESTION, instance=instance)
    lake = Lake(tmp_path)
    before = lake.read_partition("warehouse", "interactions", FIRST_DAY)

    # a well-formed file whose content breaks a rule: negative purchase amounts
    refund = (
        before.filter(pl.col("event_type") == "purchase")
        .head(3)
        .with_columns(pl.col("event_id") + "-refund", pl.col("amount") * -1)
    )
    refund.write_parquet(lake.landing_dir("interactions", FIRST_DAY) / "refunds.parquet")
    result = run_pipeline(tmp_path, FIRST_DAY, FIRST_DAY, INGESTION, instance=instance, raise_on_error=False)

    assert not result.success
    gate = check_result(result, "great_expectations")
    assert not gate.passed
    failed = [r.data for r in gate.metadata["results"].value.records if not r.data["success"]]
    assert [(f["expectation"], f["column"]) for f in failed] == [("expect_column_values_to_be_between", "amount")]
    assert lake.read_partition("warehouse", "interactions", FIRST_DAY).equals(before)
