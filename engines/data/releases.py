"""Where ground-truth releases live, for their readers (the violation detector, calibration, the
personalization evaluation's human relevance labels).
The ground_truth package writes them; a release folder is immutable once written.

    <lake>/ground_truth/<task>/releases/v0001/labels.parquet, manifest.json, README.md, label_studio.json
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

ZONE = "ground_truth"
LABELS_FILE, MANIFEST_FILE, CARD_FILE, LABEL_STUDIO_FILE = (
    "labels.parquet",
    "manifest.json",
    "README.md",
    "label_studio.json",
)


@dataclass(frozen=True)
class Release:
    task: str
    version: int
    folder: Path

    @property
    def name(self) -> str:
        return f"v{self.version:04d}"

    @property
    def lineage(self) -> str:
        """How a model's lineage names this release: "<task>/vNNNN"."""
        return f"{self.task}/{self.name}"

    def labels(self) -> pl.DataFrame:
        return pl.read_parquet(self.folder / LABELS_FILE)

    def manifest(self) -> dict:
        return json.loads((self.folder / MANIFEST_FILE).read_text())


def releases_dir(lake_root: Path, task: str) -> Path:
    return Path(lake_root) / ZONE / task / "releases"


def releases(lake_root: Path, task: str) -> list[Release]:
    """Complete releases (a manifest is written last), oldest first."""
    found = []
    for folder in sorted(releases_dir(lake_root, task).glob("v[0-9][0-9][0-9][0-9]")):
        if (folder / MANIFEST_FILE).exists():
            found.append(Release(task, int(folder.name[1:]), folder))
    return found


def newest_release(lake_root: Path, task: str) -> Release | None:
    found = releases(lake_root, task)
    return found[-1] if found else None


# Human relevance labels (the recommendation_relevance task: is this item relevant to this user?) for the
# personalization model's evaluation. A labelled item's key is "<user_id>:<item_id>".
RELEVANCE_TASK = "recommendation_relevance"
RELEVANT, NOT_RELEVANT = "relevant", "not_relevant"
RELEVANCE_SCHEMA = {"user_id": pl.Int64, "item_id": pl.Int64, "relevant": pl.Boolean, "posterior": pl.Float64}
NO_RELEASE = "no release"  # what a model's human-relevance metrics and lineage say before the first release
# the registry tag naming the ground-truth releases a model version was fed ("<task>/v0001", comma-separated)
RELEASES_TAG = "mlplane.ground_truth_releases"


def releases_tag(*fed: Release | None) -> dict[str, str]:
    """The registry tag of a model version fed by `fed` (None: a task with no release yet): every model a
    release fed records it this way, so one search of the registry finds them all."""
    names = [release.lineage for release in fed if release is not None]
    return {RELEASES_TAG: ",".join(names) if names else NO_RELEASE}


@dataclass(frozen=True)
class RelevanceLabels:
    release: Release  # what a model evaluated on these labels records in its lineage (`lineage`)
    rows: pl.DataFrame  # RELEVANCE_SCHEMA, one row per (user_id, item_id), sorted

    @property
    def lineage(self) -> str:
        return self.release.lineage


def relevance_labels(lake_root: Path, version: int | None = None) -> RelevanceLabels | None:
    """The released relevance labels as (user_id, item_id, relevant, posterior) rows: the newest release, or
    `version`; None before the first release. A key that is not "<user>:<item>" or a label outside the
    task's two raises, naming it: a label read wrongly would score the model against the wrong answer."""
    found = releases(lake_root, RELEVANCE_TASK)
    if version is not None:
        found = [r for r in found if r.version == version]
        if not found:
            raise ValueError(
                f"no release v{version:04d} of {RELEVANCE_TASK} under {releases_dir(lake_root, RELEVANCE_TASK)}"
            )
    if not found:
        return None
    release = found[-1]
    labels = release.labels()
    rows = []
    for key, label, posterior in labels.select("key", "label", "posterior").iter_rows():
        user, _, item = key.partition(":")
        if not (user.isdigit() and item.isdigit()):
            raise ValueError(f"{release.folder}: key {key!r} is not '<user_id>:<item_id>'")
        if label not in (RELEVANT, NOT_RELEVANT):
            raise ValueError(
                f"{release.folder}: label {label!r} of {key!r} is neither {RELEVANT!r} nor {NOT_RELEVANT!r}"
            )
        rows.append({"user_id": int(user), "item_id": int(item), "relevant": label == RELEVANT, "posterior": posterior})
    return RelevanceLabels(release, pl.DataFrame(rows, schema=RELEVANCE_SCHEMA).sort("user_id", "item_id"))


def human_relevance_metrics(
    scored: pl.DataFrame, scores: Sequence[float] | np.ndarray, labels: RelevanceLabels
) -> dict:
    """How a model's scores agree with human judgement: `scored` holds the (user_id, item_id) rows the model
    scored (`scores`, in the same order; a pair scored on several rows counts once, at their mean). Of those,
    the pairs a human labelled: their count, how many are relevant, and the AUC of the scores against the
    labels (None unless both kinds are there), with the release they come from (for the model's lineage)."""
    if scored.height != len(scores):
        raise ValueError(f"{scored.height} scored rows but {len(scores)} scores")
    pairs = (
        scored.select("user_id", "item_id")
        .with_columns(pl.Series("score", np.asarray(scores, dtype=float)))
        .group_by("user_id", "item_id")
        .agg(pl.col("score").mean())
        .join(labels.rows.select("user_id", "item_id", "relevant"), on=["user_id", "item_id"], how="inner")
    )
    relevant = pairs["relevant"].to_numpy()
    positives = int(relevant.sum())
    both = 0 < positives < pairs.height
    return {
        "release": labels.lineage,
        "pairs": pairs.height,
        "relevant": positives,
        "auc": _auc(relevant, pairs["score"].to_numpy()) if both else None,
    }


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the chance a relevant pair outscores a not-relevant one, ties counted half
    (the rank statistic, with average ranks)."""
    ranks = pl.Series(scores).rank("average").to_numpy()
    positives, negatives = labels.sum(), (~labels).sum()
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))
