"""The train/serve skew check shared by the assets that feed a model (training set, batch inference)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from dagster import AssetCheckResult

from assets.metadata import table
from engines.features.point_in_time import Timing
from engines.features.skew import sample_rows, skew

SKEW_CHECK = "train_serve_skew"
SKEW_DESCRIPTION = (
    "Sampled (entity, time) pairs: the feature vector the model gets on this path equals the "
    "point-in-time definition (engines.features.point_in_time) and an independent recomputation from the "
    "warehouse; mismatches and null-rate differences per view in metadata"
)
SAMPLE = 200  # (entity, time) pairs per frame


def skew_check_result(
    lake_root: Path, frames: list[pl.DataFrame], timing: Timing, what: str, sample: int = SAMPLE
) -> AssetCheckResult:
    """Each frame holds keys, `event_timestamp` and features named `<view>__<feature>` as the path gave
    them; a sample of each is compared. Fails on any mismatch or null-rate difference."""
    views = []
    for frame in frames:
        features = [c for c in frame.columns if "__" in c]
        keys = [c for c in frame.columns if c.endswith("_id") and c not in ("event_id", "session_id")]
        rows = sample_rows(frame.select(*keys, "event_timestamp", *features), sample)
        views += skew(lake_root, rows, features, timing)
    failed = [v.view for v in views if not v.passed]
    return AssetCheckResult(
        check_name=SKEW_CHECK,
        passed=not failed,
        description=f"{what}: " + (f"skew in {', '.join(failed)}" if failed else "no skew in the sample"),
        metadata={
            "sampled_rows": sum(v.rows for v in views),
            "views_failing": len(failed),
            "per_view": table([v.to_row() for v in views]),
        },
    )
