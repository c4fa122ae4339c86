"""A simulated lake built by the platform's own pipeline, for the benchmarks."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

FIRST_DAY = date(2026, 1, 1)


def build_lake(data_dir: Path, days: int = 3, scale: float = 0.25, slide_seconds: int = 3600, seed: int = 11) -> None:
    """Simulate `days` + 1 days and run the daily pipeline and the training data over the first `days`
    (the extra day is ingested only: the last day's labels look past its midnight). The streaming
    slide is hourly, which keeps the Flink backfill of the history short."""
    from dagster import AssetSelection, DagsterInstance, materialize

    from assets import all_assets
    from jobs import daily_assets, training_data_assets
    from orchestration.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
    from orchestration.profiles import resources_for
    from resources.flink import FlinkResource
    from simulator import Simulator, SimulatorConfig

    Simulator(SimulatorConfig(seed=seed, start_date=FIRST_DAY).scaled(scale), data_dir).run(days + 1)
    resources = resources_for("local", data_dir=str(data_dir))
    resources["flink"] = FlinkResource(feature_store=resources["feature_store"], slide_seconds=slide_seconds)
    last = FIRST_DAY + timedelta(days=days - 1)
    after = last + timedelta(days=1)
    for selection, first, end in (
        (AssetSelection.groups("ingestion"), after, after),
        (daily_assets | training_data_assets, FIRST_DAY, last),
    ):
        materialize(
            all_assets,
            selection=selection,
            resources=resources,
            instance=DagsterInstance.ephemeral(),
            tags={ASSET_PARTITION_RANGE_START_TAG: first.isoformat(), ASSET_PARTITION_RANGE_END_TAG: end.isoformat()},
        )
