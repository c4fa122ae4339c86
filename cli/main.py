"""`mlplane`: one command-line tool for the platform, a subcommand group per area.
Dagster's own CLI stays the way to run and backfill jobs."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import click

from cli.labeling import labeling
from cli.models import models
from cli.search import search as search_command
from cli.streaming import streaming
from demo.walkthrough import DEMO_DAYS
from orchestration.home import ensure_dagster_home, environment_executable
from orchestration.profiles import PROJECT_ROOT, local_data_dir
from serving.gateway import cli as gateway_cli
from serving.models.cli import serve_models


@click.group()
def main() -> None:
    """mlplane: the marketplace's ML platform."""


@main.command()
@click.option("--days", default=3, show_default=True, help="Days to simulate.")
@click.option(
    "--start-date",
    type=click.DateTime(["%Y-%m-%d"]),
    default=None,
    help="First day (default: DAYS days before today, so the newest day is yesterday).",
)
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
@click.option(
    "--stream",
    default="interactions",
    show_default=True,
    type=click.Choice(["interactions", "chat_messages", "abuse_reports"]),
)
@click.option(
    "--kind",
    default="bad_json",
    show_default=True,
    type=click.Choice(["bad_json", "missing_column", "wrong_type", "out_of_day"]),
    help="For malformed.",
)
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def inject(fault: str, day, stream: str, kind: str, data_dir: str | None) -> None:
    """Deliver a late, duplicated or malformed landing file for a simulated day."""
    from simulator import Simulator, SimulatorConfig

    root = Path(data_dir or local_data_dir())
    saved = root / SIMULATOR_CONFIG
    if not saved.exists():
        raise click.ClickException(f"{saved} not found: run `mlplane simulate` on this data dir first")
    simulator = Simulator(SimulatorConfig.load(saved), root)
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
    from simulator import Simulator, SimulatorConfig

    config = SimulatorConfig(seed=seed, start_date=first, file_format=file_format).scaled(scale)
    summary = Simulator(config, data_dir, click.echo).run(days)
    config.save(data_dir / SIMULATOR_CONFIG)
    return summary


@main.command()
@click.option("--days", default=DEMO_DAYS, show_default=True, help="Days to simulate and process.")
@click.option("--seed", default=0, show_default=True)
@click.option("--scale", default=1.0, show_default=True)
def demo(days: int, seed: int, scale: float) -> None:
    """Simulate DAYS days and run the platform over them on the embedded default: the daily pipeline, the
    streaming backfill, training sets, the personalization model and its gate, batch inference and a live
    recommendation; then say what came out."""
    from demo.walkthrough import run_demo

    ensure_dagster_home()
    data_dir = Path(local_data_dir())
    first = default_start(days)
    run_demo(data_dir, first, days, lambda: run_simulation(data_dir, days, first, seed, scale, "parquet"))


def default_start(days: int) -> date:
    return datetime.now(UTC).date() - timedelta(days=days)


@main.command()
@click.option("--connect", is_flag=True, help="Also open a TCP connection to each service a setting names.")
@click.option(
    "--gateway-config", default=None, help="Also check that the gateway starts on this YAML (deploy/prod/gateway.yaml)."
)
def doctor(connect: bool, gateway_config: str | None) -> None:
    """Name every missing or malformed setting of the current profile (MLPLANE_PROFILE); exit 1 if any."""
    from orchestration.settings import SETTINGS, gateway_config_problems, notes, problems, unreachable

    profile = os.environ.get("MLPLANE_PROFILE") or "local"
    checked_as = profile if profile in ("local", "prod") else "local"  # and MLPLANE_PROFILE is reported
    found = problems(os.environ, checked_as)
    if connect:
        found += unreachable(os.environ, checked_as)
    if gateway_config:
        found += gateway_config_problems(gateway_config)
    for line in [*found, *notes(os.environ, checked_as)]:
        click.echo(line, err=True)
    if found:
        raise click.ClickException(f"{len(found)} setting(s) of the {profile} profile to fix (docs/operations.md)")
    checked = sum(1 for s in SETTINGS if s.in_profile(checked_as) is not None)
    reached = " and reachable" if connect else ""
    click.echo(f"the {profile} profile's {checked} settings are complete{reached}")


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
