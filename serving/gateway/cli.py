"""`mlplane gateway ...` and `mlplane usage`: run the gateway and manage its keys and usage reports.
The commands work on the store directly (SQLite file or PostgreSQL URL), so they need no running gateway."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import click

from serving.gateway.store import LIMIT_FIELDS, GatewayStore

STORE_ENV = "MLPLANE_GATEWAY_STORE"
CONFIG_ENV = "MLPLANE_GATEWAY_CONFIG"


def open_store(store: str | None, config: str | None) -> GatewayStore:
    """The store named by --store, else by the config file's settings.store."""
    if store:
        return GatewayStore(store)
    if config:
        from serving.gateway.config import ConfigError, load_config

        try:
            return GatewayStore(load_config(config).settings.store)
        except ConfigError as error:
            raise click.ClickException(str(error)) from error
    raise click.UsageError(f"name the key store with --store, --config, ${STORE_ENV} or ${CONFIG_ENV}")


store_options = [
    click.option("--store", envvar=STORE_ENV, help="sqlite:///PATH or postgresql://... (keys and usage)."),
    click.option("--config", "config", envvar=CONFIG_ENV, help="Gateway YAML; its settings.store is used."),
]


def with_store(command):
    for option in reversed(store_options):
        command = option(command)
    return command


@click.group()
def gateway() -> None:
    """The ML gateway: serve it, manage its API keys."""


@gateway.command("serve")
@click.option("--config", "config", envvar=CONFIG_ENV, required=True, help="Gateway YAML file.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=4000, show_default=True)
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Processes; with more than one, settings.rate_limits must be a redis:// URL so that the "
    "workers share their limits.",
)
def serve_command(config: str, host: str, port: int, log_level: str, workers: int) -> None:
    """Run the gateway (SIGHUP or an edit of the file reloads its model list)."""
    import os

    import uvicorn

    from serving.gateway.config import ConfigError, load_config

    try:
        settings = load_config(config).settings
    except ConfigError as error:
        raise click.ClickException(str(error)) from error
    if workers > 1 and settings.rate_limits == "memory":
        raise click.UsageError("--workers > 1 needs settings.rate_limits: redis://... (memory limits are per process)")
    GatewayStore(settings.store).close()  # creates the tables once, before workers would race to
    os.environ[CONFIG_ENV] = str(config)
    from serving.gateway.protocol import GatewayHttpProtocol

    options = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "access_log": False,
        "timeout_graceful_shutdown": settings.drain_timeout_s,
        "http": GatewayHttpProtocol,  # a response's head and body in one write
        "proxy_headers": False,  # the gateway reads no client address: no X-Forwarded-* pass per request
    }
    if workers > 1:  # each worker imports the app factory and reads the file itself
        uvicorn.run("serving.gateway.app:app_from_env", factory=True, workers=workers, **options)
    else:
        from serving.gateway.app import create_app

        uvicorn.run(create_app(config), **options)


def serve() -> None:
    serve_command(prog_name="python -m serving.gateway")


@gateway.command("rollout")
@click.option("--config", "config", envvar=CONFIG_ENV, required=True, help="Gateway YAML with `deployments`.")
@click.option("--registry-root", envvar="MLPLANE_REGISTRY_ROOT", default="data/registry", show_default=True)
@click.option("--tracking-uri", envvar="MLPLANE_MLFLOW_TRACKING_URI", default=None, help="Overrides the root.")
@click.option("--cache-dir", default="data/gateway/models", show_default=True, help="Downloaded versions, logs.")
@click.option(
    "--gateway",
    "gateways",
    multiple=True,
    help="A gateway URL to reload at once (repeat); without any, each replica's file watch picks changes up.",
)
@click.option("--poll", default=5.0, show_default=True, help="Seconds between registry checks.")
@click.option("--once", is_flag=True, help="Bring every deployment up to date, then exit (servers keep running).")
def rollout_command(config, registry_root, tracking_uri, cache_dir, gateways, poll, once) -> None:
    """Run vLLM for the config's registry deployments and roll them when an alias moves."""
    import logging

    from serving.gateway.config import ConfigError, load_config
    from serving.gateway.rollout import Rollout, admin_key_of, registry_from

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        parsed = load_config(config)
    except ConfigError as error:
        raise click.ClickException(str(error)) from error
    controller = Rollout(
        config,
        registry_from(None if tracking_uri else registry_root, tracking_uri),
        cache_dir,
        gateways,
        admin_key_of(parsed),
    )
    if once:
        for event in controller.step():
            click.echo(json.dumps(event))
        return
    controller.run_forever(poll)  # servers outlive the controller; a restarted one adopts them


@gateway.group()
def keys() -> None:
    """Create, list, revoke and rotate API keys (stored hashed)."""


def limit_options(command):
    for name in reversed(LIMIT_FIELDS):
        unit = "tokens" if name.endswith(("tpm", "tpd")) else "requests"
        period = "minute" if name.endswith("m") else "day"
        command = click.option(
            f"--{name.replace('_', '-')}",
            name,
            type=click.IntRange(min=1),
            default=None,
            help=f"Limit of {unit} per {period}.",
        )(command)
    return command


@keys.command("create")
@click.option("--owner", required=True, help="Person or service that holds the key.")
@click.option("--team", required=True)
@click.option("--model", "models", multiple=True, help="A model the key may use (repeat); none means all.")
@click.option("--expires-in-days", type=click.FloatRange(min=0, min_open=True), default=None)
@limit_options
@with_store
def keys_create(owner, team, models, expires_in_days, store, config, **limits) -> None:
    """Create a key; its secret is printed once and never stored."""
    expires_at = time.time() + expires_in_days * 86_400 if expires_in_days else None
    secret, record = open_store(store, config).create_key(owner, team, list(models), expires_at, **limits)
    click.echo(json.dumps({"key": secret, **record.public()}, indent=2))


@gateway.group()
def teams() -> None:
    """Team limits: one budget shared by every key of a team."""


@teams.command("set")
@click.argument("team")
@limit_options
@with_store
def teams_set(team, store, config, **limits) -> None:
    """Set a team's limits (a limit left out is none); gateways apply them within a second."""
    record = open_store(store, config).set_team(team, **limits)
    click.echo(json.dumps(record.public(), indent=2))


@teams.command("list")
@with_store
def teams_list(store, config) -> None:
    """Teams with their limits."""
    for team in open_store(store, config).list_teams():
        limits = " ".join(f"{n}={getattr(team, n)}" for n in LIMIT_FIELDS if getattr(team, n) is not None)
        click.echo(f"{team.team:<16} {limits or 'no limits'}")


@keys.command("list")
@with_store
def keys_list(store, config) -> None:
    """Keys with their owners, teams, models, limits and state (never their secrets)."""
    now = time.time()
    for key in open_store(store, config).list_keys():
        state = key.problem(now) or "active"
        limits = " ".join(f"{n}={getattr(key, n)}" for n in LIMIT_FIELDS if getattr(key, n) is not None)
        expires = _when(key.expires_at) if key.expires_at else "never"
        click.echo(
            f"{key.key_id}  {key.owner:<16} {key.team:<12} models={','.join(key.models) or '*'} "
            f"expires={expires} {limits}  [{state}]"
        )


@keys.command("revoke")
@click.argument("key_id")
@with_store
def keys_revoke(key_id, store, config) -> None:
    """Revoke a key: every gateway refuses it within a second (settings.key_watch_s)."""
    try:
        record = open_store(store, config).revoke_key(key_id)
    except KeyError as error:
        raise click.ClickException(error.args[0]) from error
    click.echo(f"revoked {record.key_id} ({record.owner}, {record.team})")


@keys.command("rotate")
@click.argument("key_id")
@with_store
def keys_rotate(key_id, store, config) -> None:
    """Give a key a new secret; the old secret stops working."""
    try:
        secret, record = open_store(store, config).rotate_key(key_id)
    except (KeyError, ValueError) as error:
        raise click.ClickException(error.args[0]) from error
    click.echo(json.dumps({"key": secret, **record.public()}, indent=2))


@click.command("usage")
@click.option("--since", default=None, help="ISO date or time (UTC); default: the last 24 hours.")
@click.option("--until", default=None, help="ISO date or time (UTC); default: now.")
@click.option(
    "--group-by",
    default="key_id,team,model",
    show_default=True,
    help="Comma-separated: key_id, team, model, backend, region, status, endpoint.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON rows.")
@with_store
def usage(since, until, group_by, as_json, store, config) -> None:
    """Gateway usage report: requests, tokens, errors and mean latency per group."""
    start = _timestamp(since) if since else time.time() - 86_400
    end = _timestamp(until) if until else None
    try:
        rows = open_store(store, config).usage_report(start, end, tuple(group_by.split(",")))
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=float))
        return
    columns = [*group_by.split(","), "requests", "prompt_tokens", "completion_tokens", "errors", "mean_latency_ms"]
    click.echo("  ".join(f"{c:>16}" for c in columns))
    for row in rows:
        click.echo("  ".join(f"{_cell(row[c]):>16}" for c in columns))


def _cell(value) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _timestamp(text: str) -> float:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as error:
        raise click.BadParameter(f"{text!r} is not an ISO date or time") from error
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M")
