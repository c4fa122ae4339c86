"""`mlplane models`: the registry's versions and aliases, promotion by hand, rollback, and the model
server's keys."""

from __future__ import annotations

import getpass
import json
import os
from datetime import UTC, datetime
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


@models.group()
def keys() -> None:
    """The model server's keys: admin keys for control calls, data keys for the data plane."""


def key_file_options(command):
    command = click.option(
        "--config", "config_path", envvar="MLPLANE_MODEL_SERVER_CONFIG", default=None, help="Server YAML (keys_file)."
    )(command)
    return click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")(command)


def open_key_file(config_path: str | None, data_dir: str | None):
    from serving.models.config import ServerConfig
    from serving.models.key_file import KeyFile

    if config_path:
        return KeyFile(ServerConfig.from_yaml(config_path).keys_path())
    root = data_dir or os.environ.get("MLPLANE_DATA_DIR") or str(Path.cwd() / "data")
    return KeyFile(ServerConfig(lake_root=root).keys_path())


def show_key(secret: str, key, secret_only: bool) -> None:
    click.echo(secret if secret_only else json.dumps({"key": secret, **key.public()}, indent=2))


secret_only_option = click.option("--secret-only", is_flag=True, help="Print the secret alone (for a variable).")


@keys.command("create")
@click.argument("name")
@click.option("--role", type=click.Choice(["admin", "data"]), required=True, help="admin: control calls too.")
@secret_only_option
@key_file_options
def keys_create(name: str, role: str, secret_only: bool, config_path: str | None, data_dir: str | None) -> None:
    """Create key NAME; its secret is printed once and only its digest is stored."""
    try:
        secret, key = open_key_file(config_path, data_dir).create(name, role)
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    show_key(secret, key, secret_only)


@keys.command("rotate")
@click.argument("name")
@secret_only_option
@key_file_options
def keys_rotate(name: str, secret_only: bool, config_path: str | None, data_dir: str | None) -> None:
    """Give key NAME a new secret; running servers refuse the old one from their next request."""
    try:
        secret, key = open_key_file(config_path, data_dir).rotate(name)
    except KeyError as error:
        raise click.ClickException(error.args[0]) from error
    show_key(secret, key, secret_only)


@keys.command("revoke")
@click.argument("name")
@key_file_options
def keys_revoke(name: str, config_path: str | None, data_dir: str | None) -> None:
    """Revoke key NAME (rotating it brings it back with a new secret)."""
    try:
        key = open_key_file(config_path, data_dir).revoke(name)
    except KeyError as error:
        raise click.ClickException(error.args[0]) from error
    click.echo(f"revoked {key.name} ({key.role})")


@keys.command("list")
@key_file_options
def keys_list(config_path: str | None, data_dir: str | None) -> None:
    """Every key with its role and state (never its secret)."""
    for key in open_key_file(config_path, data_dir).read():
        state = "revoked" if key.revoked_at else "active"
        rotated = f"rotated {_when(key.rotated_at)}" if key.rotated_at else ""
        click.echo(f"{key.name:<20} {key.role:<6} created {_when(key.created_at)} {rotated} [{state}]")


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M")
