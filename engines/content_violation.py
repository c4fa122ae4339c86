"""Content-violation detection: a violation is a disguised near-copy of another creator's earlier item,
so each item is scored by its similarity to the original it may copy (`engines.copy_match`: the
nearest earlier items of other creators by image embedding, verified on pixels). No label enters the
score; the ground-truth release of the `content_violation` task (human labels, reviewed; never the
simulator's answer key) only sets the threshold at or above which an item is flagged. The flags
(`content_violations/flags/date=D`) carry the matched original's id and similarity and feed the
ground-truth queues. Before the first release there is no threshold and nothing is flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from engines.copy_match import MATCH_SCHEMA
from engines.releases import Release, newest_release

FLAGS_ZONE = "content_violations"
FLAGS_TABLE = "flags"
TASK = "content_violation"
VIOLATION = "violation"
AUDIT = "audit"  # the labeling queue of random catalogue items
FLAGS_SCHEMA = {**MATCH_SCHEMA, "flagged": pl.Boolean, "model_version": pl.String}


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


def flag_items(embeddings: pl.DataFrame, matches: pl.DataFrame, threshold: float | None) -> pl.DataFrame:
    """One row per embedded item (`embeddings`: item_id, model_version): its match (`matches`, as
    `copy_match.match_originals` gives them) and whether its similarity to that original reaches the
    threshold. Without a threshold (no release to calibrate on) nothing is flagged."""
    if embeddings.is_empty():
        return pl.DataFrame(schema=FLAGS_SCHEMA)
    return (
        embeddings.select("item_id", "model_version")
        .join(flagged_at(matches, threshold), on="item_id", how="left")
        .with_columns(pl.col("flagged").fill_null(False))
        .select(list(FLAGS_SCHEMA))
        .cast(FLAGS_SCHEMA)
    )


def flagged_at(matches: pl.DataFrame, threshold: float | None) -> pl.DataFrame:
    """`matches` with `flagged`: a similarity at or above the threshold (never without a threshold)."""
    limit = np.inf if threshold is None else threshold
    return matches.with_columns(flagged=pl.col("similarity").fill_null(-np.inf) >= limit)
