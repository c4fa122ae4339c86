"""Content-violation detection: a violation is a disguised near-copy of another creator's earlier item,
so each item is matched with the original it may copy (`engines.safety.copy_match`: the nearest earlier items
of other creators by image embedding, verified on pixels) and scored by a model over that match's
features (`engines.safety.copy_model`), fitted with its threshold on the ground-truth release of the
`content_violation` task (human labels, reviewed; never the simulator's answer key) by
`engines.safety.copy_calibration`. The flags (`content_violations/flags/date=D`) carry the matched original's
id, similarity and copy score and feed the ground-truth queues. Before the first release there is no
model and nothing is flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from engines.data.releases import Release, newest_release
from engines.safety.copy_match import MATCH_SCHEMA
from engines.safety.copy_model import copy_features

if TYPE_CHECKING:  # copy_calibration reads AUDIT through violation_accuracy
    from engines.safety.copy_calibration import Calibration

FLAGS_ZONE = "content_violations"
FLAGS_TABLE = "flags"
TASK = "content_violation"
VIOLATION = "violation"
AUDIT = "audit"  # the labeling queue of random catalogue items
FLAGS_SCHEMA = pl.Schema({**MATCH_SCHEMA, "score": pl.Float32, "flagged": pl.Boolean, "model_version": pl.String})


@dataclass(frozen=True)
class ReleaseTruth:
    """The newest release's verdicts: item_id, is_violation, audit (the item came through the random
    audit queue)."""

    release: Release
    labels: pl.DataFrame


def release_truth(lake_root: Path) -> ReleaseTruth | None:
    release = newest_release(lake_root, TASK)
    if release is None:
        return None
    labels = (
        release.labels()
        .filter(pl.col("key").str.contains(r"^\d+$"))
        .select(
            pl.col("key").cast(pl.Int64).alias("item_id"),
            (pl.col("label") == VIOLATION).alias("is_violation"),
            pl.col("queues").list.contains(AUDIT).alias("audit"),
        )
    )
    return ReleaseTruth(release, labels)


def flag_items(
    embeddings: pl.DataFrame,
    matches: pl.DataFrame,
    calibration: Calibration | None,
    similarity_cut: float | None = None,
) -> pl.DataFrame:
    """One row per embedded item (`embeddings`: item_id, model_version): its match (`matches`, as
    `copy_match.match_originals` gives them), its copy score and whether it is flagged (`scored`)."""
    if embeddings.is_empty():
        return pl.DataFrame(schema=FLAGS_SCHEMA)
    return (
        embeddings.select("item_id", "model_version")
        .join(scored(matches, calibration, similarity_cut), on="item_id", how="left")
        .with_columns(pl.col("flagged").fill_null(False))
        .select(list(FLAGS_SCHEMA))
        .cast(FLAGS_SCHEMA)
    )


def scored(matches: pl.DataFrame, calibration: Calibration | None, similarity_cut: float | None = None):
    """`matches` with `score` (the calibrated model's copy probability; null without a match or a model)
    and `flagged`: the score at or above the calibrated threshold, or, given `similarity_cut`, the
    verified similarity at or above it. Without either nothing is flagged."""
    features, matched = copy_features(matches)
    score = calibration.model.score(features) if calibration is not None else np.full(len(matched), np.nan)
    if similarity_cut is not None:
        flagged = matched & (matches["similarity"].fill_null(-np.inf).to_numpy() >= similarity_cut)
    elif calibration is not None:
        flagged = matched & (score >= calibration.threshold)
    else:
        flagged = np.zeros(len(matched), dtype=bool)
    return matches.with_columns(
        score=pl.Series(np.where(matched, score, np.nan), dtype=pl.Float32).fill_nan(None),
        flagged=pl.Series(flagged, dtype=pl.Boolean),
    )
