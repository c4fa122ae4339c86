"""`mlplane models`: the registry's versions and aliases, promotion by hand, and rollback."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import click

from orchestration.profiles import open_resource


def open_registry(data_dir: str | None):
    with open_resource("model_registry", data_dir) as resource:
        if not resource.tracking_uri and not (Path(resource.root) / "mlflow.db").exists():
            raise click.ClickException(f"no model registry at {resource.root}: train a model first")
        return resource.get_client()


@click.group()
def models() -> None:
    """Registered models: versions, aliases, promotion by hand, rollback."""


@models.command("list")
@click.option("--model", "name", default="personalization", show_default=True)
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def list_versions(name: str, data_dir: str | None) -> None:
    """Every version with its aliases, metrics and lineage."""
    registry = open_registry(data_dir)
    for version in registry.versions(name):
        aliases = ",".join(version.aliases) or "-"
        metrics = {k.removeprefix("metric."): v for k, v in version.tags.items() if k.startswith("metric.")}
        lineage = {
            k.removeprefix("mlplane."): v
            for k, v in version.tags.items()
            if k.startswith("mlplane.") and "checksum" not in k
        }
        click.echo(
            f"v{version.version}  [{aliases}]  {version.created_at:%Y-%m-%d %H:%M}  "
            f"{json.dumps(metrics)}  {json.dumps(lineage)}"
        )


@models.command()
@click.option("--model", "name", default="personalization", show_default=True)
@click.option("--alias", default="champion", show_default=True)
@click.option("--reason", required=True, help="Why: recorded in the registry with who did it.")
@click.option("--who", default=None, help="Who rolls back (default: the current user).")
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def rollback(name: str, alias: str, reason: str, who: str | None, data_dir: str | None) -> None:
    """Move an alias back to the version it pointed at before."""
    registry = open_registry(data_dir)
    try:
        previous, current = registry.rollback(name, alias, who or getpass.getuser(), reason)
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"{name} {alias}: v{previous} -> v{current}")


@models.command()
@click.argument("name")
@click.argument("version")
@click.option("--alias", default="champion", show_default=True)
@click.option("--reason", required=True, help="Why the gate is overridden: recorded on the version with who.")
@click.option("--by", "who", default=None, help="Who promotes (default: the current user).")
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def promote(name: str, version: str, alias: str, reason: str, who: str | None, data_dir: str | None) -> None:
    """Point an alias at VERSION of model NAME by hand, whatever the gate decided."""
    registry = open_registry(data_dir)
    try:
        previous = registry.promote(name, alias, version.removeprefix("v"), who or getpass.getuser(), reason)
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"{name} {alias}: {f'v{previous}' if previous else 'none'} -> v{version.removeprefix('v')}")
