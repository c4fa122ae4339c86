"""Content-violation detection: items whose image is nearly the same as a confirmed violation's are
flagged for review.

The references are the confirmed violations of the newest ground-truth release of the
`content_violation` task (human labels, reviewed; never the simulator's answer key). Each item's
score is its highest cosine similarity to another reference's image embedding; at or above the
threshold it is flagged. The threshold is calibrated on the same release: every labelled item is
scored against the *other* confirmed violations (leave one out), and the threshold with the best F1
is kept, so precision and recall against the release are honest estimates. The flags are a dataset
(`content_violations/flags/date=D`) that the ground-truth queues consume. Before the first release
there are no references and nothing is flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from engines.releases import Release, newest_release

FLAGS_ZONE = "content_violations"
FLAGS_TABLE = "flags"
TASK = "content_violation"
VIOLATION = "violation"
AUDIT = "audit"  # the labeling queue of random catalogue items
DEFAULT_THRESHOLD = 0.95


@dataclass(frozen=True)
class ReleaseTruth:
    """The newest release's verdicts: item_id, is_violation, audit (the item came through the random
    audit queue)."""

    release: Release
    labels: pl.DataFrame

    @property
    def references(self) -> list[int]:
        return self.labels.filter("is_violation")["item_id"].to_list()


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


def flag_items(embeddings: pl.DataFrame, references: pl.DataFrame, threshold: float) -> pl.DataFrame:
    """One row per embedded item: nearest reference, similarity, flagged. `embeddings` and
    `references` carry item_id and image_embedding; references are not flagged against themselves.
    Without references every item gets a row, unflagged, with no similarity."""
    schema = {
        "item_id": pl.Int64,
        "nearest_reference_id": pl.Int64,
        "similarity": pl.Float32,
        "flagged": pl.Boolean,
        "model_version": pl.String,
    }
    if embeddings.is_empty():
        return pl.DataFrame(schema=schema)
    if references.is_empty():
        return pl.DataFrame(
            {
                "item_id": embeddings["item_id"],
                "nearest_reference_id": None,
                "similarity": None,
                "flagged": False,
                "model_version": embeddings["model_version"],
            },
            schema=schema,
        )
    items = np.stack(embeddings["image_embedding"].to_numpy()).astype(np.float32)
    refs = np.stack(references["image_embedding"].to_numpy()).astype(np.float32)
    ref_ids = references["item_id"].to_numpy()
    similarity = items @ refs.T
    similarity[embeddings["item_id"].to_numpy()[:, None] == ref_ids[None, :]] = -1.0
    nearest = similarity.argmax(axis=1)
    best = similarity[np.arange(len(items)), nearest]
    return pl.DataFrame(
        {
            "item_id": embeddings["item_id"],
            "nearest_reference_id": ref_ids[nearest],
            "similarity": best,
            "flagged": best >= threshold,
            "model_version": embeddings["model_version"],
        },
        schema=schema,
    )


def calibrate_threshold(scores: pl.DataFrame, truth: pl.DataFrame) -> float | None:
    """The similarity threshold with the best F1 on the labelled items (`scores`: item_id, similarity;
    `truth`: item_id, is_violation); the highest such threshold on ties. None without both classes."""
    joined = scores.join(truth, on="item_id").drop_nulls("similarity")
    if joined["is_violation"].n_unique() < 2:
        return None
    similarity = joined["similarity"].to_numpy()
    positive = joined["is_violation"].to_numpy()
    best, best_f1 = None, -1.0
    for threshold in sorted(set(similarity.tolist()), reverse=True):
        flagged = similarity >= threshold
        tp = int((flagged & positive).sum())
        f1 = 2 * tp / (flagged.sum() + positive.sum())
        if f1 > best_f1:
            best, best_f1 = float(threshold), f1
    return best


def precision_recall(flags: pl.DataFrame, truth: pl.DataFrame) -> dict:
    """Flags of the labelled items against their labels (items without a label are not counted)."""
    joined = flags.join(truth.select("item_id", "is_violation"), on="item_id", how="inner")
    tp = joined.filter(pl.col("flagged") & pl.col("is_violation")).height
    flagged = joined.filter(pl.col("flagged")).height
    violations = joined.filter(pl.col("is_violation")).height
    return {
        "labelled_items": joined.height,
        "flagged": flagged,
        "violations": violations,
        "true_positives": tp,
        "precision": tp / flagged if flagged else None,
        "recall": tp / violations if violations else None,
    }
