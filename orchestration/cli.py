"""`mlplane`: one command-line tool for the platform, a subcommand group per area.
Dagster's own CLI stays the way to run and backfill jobs."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import click

from orchestration.home import ensure_dagster_home, environment_executable
from orchestration.labeling_cli import labeling
from orchestration.models_cli import models
from orchestration.profiles import PROJECT_ROOT, local_data_dir
from orchestration.search_cli import search as search_command
from orchestration.streaming_cli import streaming
from serving.gateway import cli as gateway_cli
from serving.models.cli import serve_models


@click.group()
def main() -> None:
    """mlplane: the marketplace's ML platform."""


@main.command()
@click.option("--days", default=3, show_default=True, help="Days to simulate.")
@click.option("--start-date", type=click.DateTime(["%Y-%m-%d"]), default=None,
              help="First day (default: DAYS days before today, so the newest day is yesterday).")
@click.option("--seed", default=0, show_default=True)
@click.option("--scale", default=1.0, show_default=True, help="Multiplier of users, creators and items.")
@click.option("--format", "file_format", type=click.Choice(["parquet", "jsonl"]), default="parquet")
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def simulate(days: int, start_date, seed: int, scale: float, file_format: str, data_dir: str | None) -> None:
    """Write simulated marketplace landing files, as the upstream systems would."""
    first = start_date.date() if start_date else default_start(days)
    summary = run_simulation(Path(data_dir or local_data_dir()), days, first, seed, scale, file_format)
    click.echo(json.dumps({k: v for k, v in summary.items() if k != "days"}, indent=2, default=str))


@main.command()
@click.argument("fault", type=click.Choice(["late", "duplicate", "malformed"]))
@click.option("--date", "day", type=click.DateTime(["%Y-%m-%d"]), required=True, help="The landing day.")
@click.option("--stream", default="interactions", show_default=True,
              type=click.Choice(["interactions", "chat_messages", "abuse_reports"]))
@click.option("--kind", default="bad_json", show_default=True,
              type=click.Choice(["bad_json", "missing_column", "wrong_type", "out_of_day"]), help="For malformed.")
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def inject(fault: str, day, stream: str, kind: str, data_dir: str | None) -> None:
    """Deliver a late, duplicated or malformed landing file for a simulated day."""
    from engines.simulator import Simulator, SimulatorConfig

    root = Path(data_dir or local_data_dir())
    saved = root / SIMULATOR_CONFIG
    if not saved.exists():
        raise click.ClickException(f"{saved} not found: run `mlplane simulate` on this data dir first")
    config = json.loads(saved.read_text())
    config["start_date"] = date.fromisoformat(config["start_date"])
    simulator = Simulator(SimulatorConfig(**config), root)
    if fault == "late":
        path = simulator.write_late_file(day.date(), stream)
    elif fault == "duplicate":
        path = simulator.write_duplicate_file(day.date(), stream)
    else:
        path = simulator.write_malformed_file(day.date(), stream, kind)
    click.echo(f"wrote {path}")


SIMULATOR_CONFIG = Path("sim_truth") / "simulator_config.json"


def run_simulation(data_dir: Path, days: int, first: date, seed: int, scale: float, file_format: str) -> dict:
    """Simulate, and keep the configuration so `mlplane inject` can add files for the same world."""
    from dataclasses import asdict

    from engines.simulator import Simulator, SimulatorConfig

    config = SimulatorConfig(seed=seed, start_date=first, file_format=file_format).scaled(scale)
    summary = Simulator(config, data_dir, click.echo).run(days)
    (data_dir / SIMULATOR_CONFIG).write_text(json.dumps(asdict(config), default=str, indent=2))
    return summary


@main.command()
@click.option("--days", default=3, show_default=True, help="Days to simulate and process.")
@click.option("--seed", default=0, show_default=True)
@click.option("--scale", default=1.0, show_default=True)
def demo(days: int, seed: int, scale: float) -> None:
    """Simulate DAYS days, run the daily pipeline and the streaming backfill over them on the embedded default,
    and say what came out."""
    ensure_dagster_home()
    data_dir = Path(local_data_dir())
    first = default_start(days)
    last = first + timedelta(days=days - 1)
    started = time.monotonic()
    click.echo(f"1/3 simulating {days} days ({first} .. {last}) into {data_dir}/landing")
    run_simulation(data_dir, days, first, seed, scale, "parquet")
    click.echo("2/3 materializing the asset graph (Dagster runs, visible in the UI)")
    materialize_everything(first, last)
    remember_landed_days(data_dir, first, last)
    click.echo(f"3/3 done in {time.monotonic() - started:.0f} s\n")
    print_summary(data_dir, first, last)


def default_start(days: int) -> date:
    return datetime.now(UTC).date() - timedelta(days=days)


def materialize_everything(first: date, last: date) -> None:
    """The registry, then every daily asset over the range in one run, the streaming views' windows over the
    same days (one Flink batch job), the training sets of the days whose next day is there (a day's labels
    look past its midnight; the last day's waits for the next day's interactions), then the data-quality
    report."""
    from dagster import AssetKey, DagsterInstance
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from orchestration.definitions import defs

    instance = DagsterInstance.get()
    days = {ASSET_PARTITION_RANGE_START_TAG: first.isoformat(), ASSET_PARTITION_RANGE_END_TAG: last.isoformat()}
    labelled = {ASSET_PARTITION_RANGE_START_TAG: first.isoformat(),
                ASSET_PARTITION_RANGE_END_TAG: (last - timedelta(days=1)).isoformat()}
    steps = [
        ("feature_store_refresh", ["feature_registry"], {}),
        ("daily_pipeline", None, days),
        ("streaming_backfill", None, days),
        *([("training_data", ["datasets/personalization_training"], labelled)] if last > first else []),
        ("feature_store_refresh", ["data_quality_report"], {}),
    ]
    for job_name, selection, tags in steps:
        job = defs.resolve_job_def(job_name)
        keys = [AssetKey(k.split("/")) for k in selection] if selection else None
        click.echo(f"   running {job_name}{' ' + ', '.join(selection) if selection else ''} ...")
        result = job.execute_in_process(instance=instance, tags=tags, asset_selection=keys, raise_on_error=False,
                                        run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}})
        if not result.success:
            raise click.ClickException(f"run {result.run_id} of {job_name} failed; see `mlplane ui`")


def remember_landed_days(data_dir: Path, first: date, last: date) -> None:
    """Leave the landing sensor's cursor at the days just run, so `mlplane ui` does not run them again."""
    from dagster import DagsterInstance

    from engines.lake import Lake
    from orchestration.home import set_sensor_cursor
    from orchestration.sensors import landing_cursor, landing_sensor

    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    with DagsterInstance.get() as instance:
        set_sensor_cursor(instance, landing_sensor.name, landing_cursor(Lake(data_dir), days))


def print_summary(data_dir: Path, first: date, last: date) -> None:
    import polars as pl

    from engines.quality import QualityEngine

    click.echo("What was produced:")
    for zone in ("warehouse", "offline", "datasets", "streaming_history"):
        for table_dir in sorted((data_dir / zone).glob("*")):
            files = sorted(table_dir.glob("date=*/part-0.parquet"))
            rows = sum(pl.scan_parquet(f).select(pl.len()).collect().item() for f in files)
            click.echo(f"  {zone + '/' + table_dir.name:<42} {len(files):>3} partitions {rows:>10,} rows")
    click.echo(f"  feature store: Feast repo in {data_dir / 'feature_repo'} (feast -c {data_dir / 'feature_repo'} "
               "feature-views list)")
    quality = QualityEngine(data_dir / "quality")
    latest = quality.latest_results()
    failing = [r["suite"] for r in latest if not r["success"]]
    listed = f": {', '.join(failing)}" if failing else ""
    click.echo(f"\nData quality: {len(latest)} suites, {len(failing)} failing{listed}")
    click.echo(f"Data-quality report: {quality.docs_index_path}")
    click.echo(f"Dagster UI: .venv/bin/mlplane ui, then http://127.0.0.1:3000 (runs for {first} .. {last} are there)")


@main.command()
@click.option("--port", default=3000, show_default=True)
def ui(port: int) -> None:
    """Serve the Dagster UI and daemon (schedules, sensors) for this project."""
    ensure_dagster_home()
    dagster = environment_executable("dagster")
    os.execv(dagster, [dagster, "dev", "-w", str(PROJECT_ROOT / "workspace.yaml"), "-p", str(port)])


@main.group()
def features() -> None:
    """The feature store."""


@features.command("list")
def features_list() -> None:
    """Feature views and services of the DSL catalogue."""
    from feature_defs import catalogue

    for view in catalogue.views:
        kind = "streaming" if view.streaming else view.source.kind
        click.echo(f"{view.name:<24} {','.join(view.join_keys):<16} {kind:<9} {len(view.features):>2} features")
    for service in catalogue.services:
        click.echo(f"service {service.name}: {', '.join(v.name for v in service.views)}")


@features.command("get")
@click.argument("service")
@click.option("--entity", "entities", multiple=True, required=True, help="key=value, e.g. user_id=3 (repeatable)")
def features_get(service: str, entities: tuple[str, ...]) -> None:
    """Online feature values of one entity row for a feature service."""
    from orchestration.profiles import open_resource

    row = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (e.split("=", 1) for e in entities)}
    with open_resource("feature_store") as feature_store:
        values = feature_store.get_client().online_features(service, [row])
    click.echo(json.dumps({k: v[0] for k, v in values.items()}, indent=2, default=str))


@main.group()
def serve() -> None:
    """Long-running services."""


serve.add_command(serve_models)
main.add_command(search_command)
main.add_command(streaming)
main.add_command(models)
main.add_command(labeling)
main.add_command(gateway_cli.gateway)
main.add_command(gateway_cli.usage)

if __name__ == "__main__":
    sys.exit(main())
