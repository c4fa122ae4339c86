"""Notebook to pipeline: one call turns a data scientist's notebook into a scheduled, partitioned,
monitored Dagster asset, and the notebook stays runnable in Jupyter exactly as it was.

    daily_top_items = notebook_pipeline("examples/notebooks/daily_top_items.ipynb",
                                        description="...", deps=[...], partitions_def=daily_partitions)

Each run executes the notebook with papermill on this environment's kernel, passing `day` (the
partition) and `data_dir` (the lake) as parameters after the cell tagged `parameters` (the notebook's
own defaults stay for interactive use). The executed notebook, outputs and errors included, is
stored per run at <lake>/notebooks/<name>/date=<day>/<run id>.ipynb and linked from the asset's
metadata. Monitoring: a failed cell fails the run (the failure sensor posts it, also to `notify`
targets), and a freshness check expects the day's partition by `freshness_deadline_cron`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from dagster import (
    AssetKey,
    BackfillPolicy,
    Failure,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    asset,
    build_schedule_from_partitioned_job,
    build_time_partition_freshness_checks,
    define_asset_job,
)

from assets.pipelines import pipeline_tags
from resources.lake import LakeResource

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_ZONE = "notebooks"


@dataclass
class NotebookPipeline:
    name: str
    notebook: Path
    assets: list
    asset_checks: list
    job: object
    schedule: object


def output_notebook_path(lake_root: str | Path, name: str, day: str, run_id: str) -> Path:
    return Path(lake_root) / NOTEBOOKS_ZONE / name / f"date={day}" / f"{run_id}.ipynb"


def notebook_pipeline(
    notebook: str | Path,
    *,
    description: str,
    partitions_def: PartitionsDefinition,
    deps: list | tuple = (),
    name: str | None = None,
    group: str = "notebooks",
    owners: tuple[str, ...] = ("team:data-science",),
    hour_of_day: int = 6,
    minute_of_hour: int = 0,
    freshness_deadline_cron: str = "0 9 * * *",
    pool: str = "cpu",
    priority: str = "normal",
    notify: tuple[str, ...] = (),
    timeout_seconds: int = 1800,
) -> NotebookPipeline:
    """The asset `notebooks/<name>`, its freshness check, a partitioned job and a daily schedule."""
    path = Path(notebook) if Path(notebook).is_absolute() else PROJECT_ROOT / notebook
    if not path.is_file():
        raise FileNotFoundError(f"notebook {path} not found")
    name = name or path.stem
    tags = pipeline_tags(pool, 0, priority, notify)

    run_notebook = notebook_asset(
        path,
        name,
        description=description,
        partitions_def=partitions_def,
        deps=deps,
        group=group,
        owners=owners,
        tags=tags,
        timeout_seconds=timeout_seconds,
    )
    checks = build_time_partition_freshness_checks(
        assets=[run_notebook], deadline_cron=freshness_deadline_cron, timezone="UTC"
    )
    job = define_asset_job(
        f"notebook_{name}",
        selection=[AssetKey([NOTEBOOKS_ZONE, name])],
        tags=tags,
        description=f"Run notebook {path.name} for a day.",
    )
    schedule = build_schedule_from_partitioned_job(job, hour_of_day=hour_of_day, minute_of_hour=minute_of_hour)
    return NotebookPipeline(name, path, [run_notebook], list(checks), job, schedule)


def notebook_asset(
    path: Path,
    name: str,
    *,
    description: str,
    partitions_def: PartitionsDefinition,
    deps: list | tuple,
    group: str,
    owners: tuple[str, ...],
    tags: dict[str, str],
    timeout_seconds: int,
):
    """`notebooks/<name>`: the notebook run for the partition's day, the executed copy kept in the lake."""

    @asset(
        key=AssetKey([NOTEBOOKS_ZONE, name]),
        group_name=group,
        description=f"{description} (notebook {path.name}, run by papermill)",
        partitions_def=partitions_def,
        deps=list(deps),
        kinds={"jupyter", "python"},
        owners=list(owners),
        op_tags=tags,
        backfill_policy=BackfillPolicy.multi_run(1),
    )
    def run_notebook(context, lake: LakeResource) -> MaterializeResult:
        day = context.partition_key
        output = output_notebook_path(lake.root, name, day, context.run.run_id)
        output.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        execute_notebook(path, output, day, Path(lake.root).resolve(), timeout_seconds)
        return MaterializeResult(
            metadata={
                "output_notebook": MetadataValue.notebook(str(output)),
                "notebook": MetadataValue.path(str(path)),
                "seconds": round(time.monotonic() - started, 1),
            }
        )

    return run_notebook


def execute_notebook(path: Path, output: Path, day: str, data_dir: Path, timeout_seconds: int) -> None:
    """Run the notebook with papermill into `output`; a failed cell fails the run, naming the cell."""
    import papermill

    try:
        papermill.execute_notebook(
            str(path),
            str(output),
            parameters={"day": day, "data_dir": str(data_dir)},
            kernel_name="python3",
            cwd=str(path.parent),
            progress_bar=False,
            log_output=False,
            execution_timeout=timeout_seconds,
        )
    except papermill.PapermillExecutionError as error:  # the executed notebook shows the failing cell
        raise Failure(
            f"notebook {path.name} failed in cell {error.exec_count}: {error.ename}: {error.evalue}",
            metadata={"output_notebook": MetadataValue.notebook(str(output))},
        ) from error
