"""Notebook to pipeline: the example notebook runs as a daily asset through Dagster (papermill on the
environment's kernel), its output notebook is kept per run, its report equals an independent
computation from the warehouse, a failing notebook fails the run with the cell named, and the
notebook still runs on its own as it was."""

from __future__ import annotations

import json
import shutil
from datetime import date

import polars as pl
import pytest
from dagster import AssetKey, AssetSelection, DagsterInstance, materialize

from assets import all_assets
from assets.notebooks import notebook_pipeline, output_notebook_path
from assets.partitions import daily_partitions
from assets.reports import daily_top_items
from engines.data.lake import Lake
from orchestration.profiles import resources_for
from tests.conftest import FIRST_DAY, run_pipeline, simulate

pytestmark = pytest.mark.services  # Jupyter kernels


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("notebook_lake")
    simulate(data_dir, days=2)
    run_pipeline(data_dir, FIRST_DAY, date(2026, 1, 2), selection=AssetSelection.assets(["warehouse", "interactions"]))
    return data_dir


def expected_top(lake_dir, day: date) -> pl.DataFrame:
    events = pl.read_parquet(lake_dir / "warehouse" / "interactions" / f"date={day}" / "*.parquet")
    counts: dict[int, list[int]] = {}
    for item, kind in events.select("item_id", "event_type").iter_rows():
        pair = counts.setdefault(item, [0, 0])
        pair[0] += kind == "impression"
        pair[1] += kind == "click"
    rows = sorted(counts.items(), key=lambda kv: (-kv[1][1], kv[0]))[:20]
    return pl.DataFrame(
        {"item_id": [i for i, _ in rows], "clicks": [c for _, (_, c) in rows], "impressions": [n for _, (n, _) in rows]}
    )


def test_the_notebook_runs_daily_with_its_output_kept_per_run(lake_dir):
    instance = DagsterInstance.ephemeral()
    runs = []
    for _ in range(2):  # a re-run keeps both executed notebooks
        result = materialize(
            all_assets,
            selection=AssetSelection.assets(*daily_top_items.assets),
            resources=resources_for("local", data_dir=str(lake_dir)),
            instance=instance,
            partition_key="2026-01-02",
        )
        assert result.success
        runs.append(result.run_id)
    for run_id in runs:
        executed = output_notebook_path(lake_dir, "daily_top_items", "2026-01-02", run_id)
        cells = json.loads(executed.read_text())["cells"]
        assert any("injected-parameters" in c["metadata"].get("tags", []) for c in cells)
        assert all(o.get("output_type") != "error" for c in cells for o in c.get("outputs", []))
    event = instance.get_latest_materialization_event(AssetKey(["notebooks", "daily_top_items"]))
    assert event.asset_materialization.metadata["output_notebook"].value.endswith(f"{runs[-1]}.ipynb")

    report = Lake(lake_dir).read_partition("reports", "daily_top_items", date(2026, 1, 2))
    want = expected_top(lake_dir, date(2026, 1, 2))
    assert report.select("item_id", "clicks", "impressions").to_dicts() == want.to_dicts()


def test_a_failing_notebook_fails_the_run_naming_the_cell_and_keeps_its_output(lake_dir, tmp_path):
    broken = tmp_path / "broken.ipynb"
    shutil.copy(daily_top_items.notebook, broken)
    notebook = json.loads(broken.read_text())
    notebook["cells"][2]["source"] = "raise ValueError('no such table')"
    broken.write_text(json.dumps(notebook))
    pipeline = notebook_pipeline(broken, description="A notebook that fails", partitions_def=daily_partitions)
    result = materialize(
        pipeline.assets,
        resources={"lake": resources_for("local", str(lake_dir))["lake"]},
        instance=DagsterInstance.ephemeral(),
        partition_key="2026-01-01",
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "failed in cell" in failure.step_failure_data.error.message
    assert "no such table" in failure.step_failure_data.error.message
    assert output_notebook_path(lake_dir, "broken", "2026-01-01", result.run_id).exists()


def test_the_notebook_still_runs_on_its_own(lake_dir, tmp_path):
    import papermill

    out = tmp_path / "as-is.ipynb"
    papermill.execute_notebook(
        str(daily_top_items.notebook),
        str(out),
        parameters={"data_dir": str(lake_dir)},
        kernel_name="python3",
        cwd=str(daily_top_items.notebook.parent),
        progress_bar=False,
    )
    # its own default: the newest day
    assert (lake_dir / "reports" / "daily_top_items" / "date=2026-01-02" / "part-0.parquet").exists()
