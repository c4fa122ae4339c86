"""`mlplane streaming`: feed and watch the streaming feature jobs. Starting a job is a Dagster
materialization of its asset (`streaming/<source>`), and a backfill one of `streaming_history/*`
(job `streaming_backfill`), so runs, restarts and backfills show in the UI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from orchestration.profiles import local_data_dir, open_resource


@click.group()
def streaming() -> None:
    """Streaming features on Flink."""


@streaming.command("simulate")
@click.option("--rate", default=50.0, show_default=True, help="Events per second.")
@click.option("--seconds", default=600.0, show_default=True, help="How long to keep appending.")
@click.option("--seed", default=0, show_default=True)
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def simulate_stream(rate: float, seconds: float, seed: int, data_dir: str | None) -> None:
    """Append live interaction events (stamped now) to <lake>/stream/interactions, as a producer would."""
    from simulator import Simulator, SimulatorConfig
    from simulator.stream import EventStream

    root = Path(data_dir or local_data_dir())
    day = datetime.now(UTC).date() - timedelta(days=1)
    stream = EventStream(
        Simulator(SimulatorConfig(seed=seed, start_date=day), root / "sim_stream"), root / "stream" / "interactions"
    )
    click.echo(f"appending {rate:g} events/s for {seconds:g} s to {stream.directory}")
    written = stream.live(rate, seconds, day)
    click.echo(f"appended {written} events")


@streaming.command("status")
def status() -> None:
    """Health of every streaming job: status, checkpoint age, lag, malformed and late events."""
    from engines.streaming import streaming_sources

    with open_resource("flink") as flink:
        for source in streaming_sources():
            click.echo(json.dumps(flink.health(source).to_dict(), indent=2))


@streaming.command("stop")
def stop() -> None:
    """Stop every local streaming job and its pusher (they resume from their checkpoints when started)."""
    from engines.streaming import streaming_sources

    with open_resource("flink") as flink:
        for source in streaming_sources():
            flink.stop(source)
            click.echo(f"stopped {source}")
