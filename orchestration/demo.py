"""`mlplane demo`: the platform over a simulated marketplace. Each part is a Dagster run in the local
instance (the UI shows them afterwards) or a call to a service started for a moment; the end says what
came out and where to look."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import click

# Days whose training sets exist before the held-out one: the demo's last day waits for the next day's
# interactions, so four days give two training days and a held-out one; the personalization gate needs
# that much history for the model to beat popularity (benchmarks/model_quality.py shows the margin).
DEMO_DAYS = 4
MODEL = "personalization"
RECOMMENDATIONS = "inference/personalization_recommendations"


def run_demo(data_dir: Path, first: date, days: int, simulate: Callable[[], object]) -> None:
    last = first + timedelta(days=days - 1)
    started = time.monotonic()
    click.echo(f"1/5 simulating {days} days ({first} .. {last}) into {data_dir}/landing")
    simulate()
    click.echo("2/5 the daily pipeline, the streaming backfill and the training sets (Dagster runs, in the UI)")
    materialize_data(first, last)
    remember_landed_days(data_dir, first, last)
    click.echo(f"3/5 training {MODEL} (Ray Train), gating it against popularity, promoting it")
    champion = train_and_gate(data_dir, last)
    if champion:
        click.echo(f"4/5 batch inference: v{champion}'s lists for every active user, into the online store")
        if not run_job("batch_inference", [RECOMMENDATIONS], partition=last).success:
            raise click.ClickException("the batch inference run failed; see `mlplane ui`")
        click.echo("5/5 a live recommendation from the model server (`mlplane serve models`, for a moment)")
        live_recommendation(data_dir)
    else:
        click.echo("4/5 and 5/5 skipped: no champion to serve (the gate kept the version a challenger)")
    click.echo(f"done in {time.monotonic() - started:.0f} s\n")
    print_summary(data_dir, first, last)


def train_and_gate(data_dir: Path, last: date) -> str | None:
    """The train_personalization job for the newest day; the champion's version afterwards, if any."""
    from engines.registry import ModelRegistry

    run_job(f"train_{MODEL}", None, partition=last)  # a refused gate fails the run: the version stays a challenger
    registry = ModelRegistry.local(data_dir / "registry")
    for version in registry.versions(MODEL):
        metrics = {k: round(v, 3) for k, v in version.metrics.items()}
        click.echo(f"   v{version.version} [{','.join(version.aliases) or '-'}] {metrics}")
    champion = registry.by_alias(MODEL, "champion")
    return champion.version if champion else None


def live_recommendation(data_dir: Path) -> None:
    """Start the model server over the lake, ask it for one active user's top 5, stop it."""
    import httpx

    from engines.batch_inference import active_users
    from engines.lake import Lake
    from serving.models.background import running_model_server
    from serving.models.config import ServerConfig

    lake = Lake(data_dir)
    user = active_users(lake, max(lake.partition_days("warehouse", "interactions")))[0]
    config = ServerConfig.local(data_dir, feature_log_sample=0.0)
    config.models = [m for m in config.models if m.name == MODEL]  # the champion's towers: no CLIP needed here
    with running_model_server(config) as url:
        answer = httpx.post(f"{url}/recommend", json={"user_id": user, "k": 5}, timeout=60)
        answer.raise_for_status()
    body = answer.json()
    click.echo(
        f'   POST /recommend {{"user_id": {user}, "k": 5}} -> items {body["items"]} '
        f"(scores {[round(s, 3) for s in body['scores']]}), model version {body['model_version']}, "
        f"{body['timings_ms']['total']:.1f} ms"
    )


def materialize_data(first: date, last: date) -> None:
    """The registry, then every daily asset over the range in one run, the streaming views' windows over the
    same days (one Flink batch job), the training sets of the days whose next day is there (a day's labels
    look past its midnight; the last day's waits for the next day's interactions), then the data-quality
    report."""
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    days = {ASSET_PARTITION_RANGE_START_TAG: first.isoformat(), ASSET_PARTITION_RANGE_END_TAG: last.isoformat()}
    labelled = {
        ASSET_PARTITION_RANGE_START_TAG: first.isoformat(),
        ASSET_PARTITION_RANGE_END_TAG: (last - timedelta(days=1)).isoformat(),
    }
    steps = [
        ("feature_store_refresh", ["feature_registry"], {}),
        ("daily_pipeline", None, days),
        ("streaming_backfill", None, days),
        *([("training_data", ["datasets/personalization_training"], labelled)] if last > first else []),
        ("feature_store_refresh", ["data_quality_report"], {}),
    ]
    for job_name, selection, tags in steps:
        if not run_job(job_name, selection, tags=tags).success:
            raise click.ClickException(f"the run of {job_name} failed; see `mlplane ui`")


def run_job(job_name: str, selection: list[str] | None, tags: dict | None = None, partition: date | None = None):
    """One run of a definitions job in this process, recorded in the instance (the UI shows it)."""
    from dagster import AssetKey, DagsterInstance

    from orchestration.definitions import defs

    keys = [AssetKey(k.split("/")) for k in selection] if selection else None
    click.echo(f"   running {job_name}{' ' + ', '.join(selection) if selection else ''} ...")
    return defs.resolve_job_def(job_name).execute_in_process(
        instance=DagsterInstance.get(),
        tags=tags or {},
        asset_selection=keys,
        raise_on_error=False,
        partition_key=partition.isoformat() if partition else None,
        run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
    )


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
    click.echo(
        f"  feature store: Feast repo in {data_dir / 'feature_repo'} (feast -c {data_dir / 'feature_repo'} "
        "feature-views list)"
    )
    quality = QualityEngine(data_dir / "quality")
    latest = quality.latest_results()
    failing = [r["suite"] for r in latest if not r["success"]]
    listed = f": {', '.join(failing)}" if failing else ""
    click.echo(f"\nData quality: {len(latest)} suites, {len(failing)} failing{listed}")
    click.echo(f"Data-quality report: {quality.docs_index_path}")
    click.echo(f"Dagster UI: .venv/bin/mlplane ui, then http://127.0.0.1:3000 (runs for {first} .. {last} are there)")
