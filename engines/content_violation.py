"""Content-violation detection: items whose image is nearly the same as a known-violating
reference item's are flagged for review.

The references are items already judged violating (here the simulator's answer key names the
originals that disguised copies imitate). Each item's score is its highest cosine similarity to a
reference's image embedding; at or above the threshold it is flagged. The flags are a dataset
(`content_violations/flags/date=D`) that the ground-truth review flow consumes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

FLAGS_ZONE = "content_violations"
FLAGS_TABLE = "flags"
DEFAULT_THRESHOLD = 0.95


def reference_items(lake_root: Path) -> list[int]:
    path = Path(lake_root) / "sim_truth" / "reference_items.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: the list of known-violating reference items is missing")
    return pl.read_parquet(path)["item_id"].to_list()


def violation_truth(lake_root: Path) -> pl.DataFrame:
    """item_id, is_violation, reference_item_id from the simulator's answer key."""
    files = sorted((Path(lake_root) / "sim_truth" / "items").glob("date=*/*.parquet"))
    if not files:
        return pl.DataFrame(schema={"item_id": pl.Int64, "is_violation": pl.Boolean, "reference_item_id": pl.Int64})
    return pl.concat([pl.read_parquet(f) for f in files]).unique("item_id", keep="last")


def flag_items(embeddings: pl.DataFrame, references: pl.DataFrame, threshold: float) -> pl.DataFrame:
    """One row per embedded item: nearest reference, similarity, flagged. `embeddings` and
    `references` carry item_id and image_embedding; references are not flagged against themselves."""
    schema = {"item_id": pl.Int64, "nearest_reference_id": pl.Int64, "similarity": pl.Float32,
              "flagged": pl.Boolean, "model_version": pl.String}
    if embeddings.is_empty() or references.is_empty():
        return pl.DataFrame(schema=schema)
    items = np.stack(embeddings["image_embedding"].to_numpy()).astype(np.float32)
    refs = np.stack(references["image_embedding"].to_numpy()).astype(np.float32)
    ref_ids = references["item_id"].to_numpy()
    similarity = items @ refs.T
    similarity[embeddings["item_id"].to_numpy()[:, None] == ref_ids[None, :]] = -1.0
    nearest = similarity.argmax(axis=1)
    best = similarity[np.arange(len(items)), nearest]
    return pl.DataFrame({
        "item_id": embeddings["item_id"],
        "nearest_reference_id": ref_ids[nearest],
        "similarity": best,
        "flagged": best >= threshold,
        "model_version": embeddings["model_version"],
    }, schema=schema)


def precision_recall(flags: pl.DataFrame, truth: pl.DataFrame) -> dict:
    """Flags against the answer key (references themselves excluded: they are the known cases)."""
    joined = flags.join(truth.select("item_id", "is_violation"), on="item_id", how="left") \
                  .with_columns(pl.col("is_violation").fill_null(False))
    tp = joined.filter(pl.col("flagged") & pl.col("is_violation")).height
    flagged = joined.filter(pl.col("flagged")).height
    violations = joined.filter(pl.col("is_violation")).height
    return {"flagged": flagged, "violations": violations, "true_positives": tp,
            "precision": tp / flagged if flagged else None, "recall": tp / violations if violations else None}
