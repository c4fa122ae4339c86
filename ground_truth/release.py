"""Versioned, immutable dataset releases of a task's resolved labels: Parquet (with each label's posterior
under the annotator model), a manifest (counts, class balance, agreement with its interval, the annotator
model, annotators and who is flagged, source queues, content hash), a short dataset card and a
Label Studio import file. An unchanged label set makes no new version; nothing is overwritten."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from engines.data.releases import (
    CARD_FILE,
    LABEL_STUDIO_FILE,
    LABELS_FILE,
    MANIFEST_FILE,
    Release,
    newest_release,
    releases_dir,
)
from ground_truth import review
from ground_truth.annotator_model import AnnotatorModel
from ground_truth.queue import Task
from ground_truth.review import ItemState, TaskQuality

SCHEMA: dict[str, pl.DataType] = {
    "key": pl.String(),
    "label": pl.String(),
    "resolved_by": pl.String(),
    "posterior": pl.Float64(),  # the annotator model's probability of the label (1.0 for a verdict: it is given)
    "answers": pl.Int64(),
    "annotators": pl.List(pl.String),
    "answer_labels": pl.List(pl.String),
    "queues": pl.List(pl.String),
    "title": pl.String(),
    "thumbnail": pl.String(),
    "model_score": pl.Float64(),
}


@dataclass(frozen=True)
class Candidate:
    """What a release would hold, before the checks decide whether it is written."""

    task: Task
    labels: pl.DataFrame
    quality: TaskQuality
    model: AnnotatorModel | None = None

    @property
    def content_hash(self) -> str:
        rows = self.labels.sort("key").select("key", "label").rows()
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()

    def class_balance(self) -> dict[str, float]:
        counts = self.labels["label"].value_counts()
        return {r["label"]: r["count"] / self.labels.height for r in counts.iter_rows(named=True)}

    def summary(self) -> pl.DataFrame:
        """One row of release-level figures for the blocking checks."""
        balance = self.class_balance()
        return pl.DataFrame(
            {
                "items": [self.labels.height],
                "krippendorff_alpha": [self.quality.krippendorff_alpha],
                "krippendorff_alpha_low": [self.quality.krippendorff_alpha_low],
                "unresolved_disagreements": [self.quality.disputed_open],
                "smallest_class_share": [
                    min((balance.get(label, 0.0) for label in self.task.spec.labels or []), default=None)
                ],
            },
            schema={
                "items": pl.Int64,
                "krippendorff_alpha": pl.Float64,
                "krippendorff_alpha_low": pl.Float64,
                "unresolved_disagreements": pl.Int64,
                "smallest_class_share": pl.Float64,
            },
        )


def candidate(
    task: Task, states: list[ItemState], quality: TaskQuality, model: AnnotatorModel | None = None
) -> Candidate:
    """The resolved items (verdict, else the annotator model's label at the task's confidence, else a
    unanimous answer) with their posteriors; gold questions and open items left out."""
    k, labels = task.spec.annotators_per_item, task.spec.labels
    if model is None:
        weights = {a.annotator: a.weight for a in quality.annotators if a.weight != 1.0}
        model = review.fit_model(task, states, weights)
    rows = []
    for s in states:
        posterior = model.posteriors.get(s.key) if model else None
        label, how = s.resolution(k, posterior, task.spec.labels, task.spec.confidence)
        if s.is_gold_question or label is None:
            continue
        rows.append(
            {
                "key": s.key,
                "label": label,
                "resolved_by": how,
                # a posterior comes from the annotator model, which a task has only with its labels
                "posterior": posterior[labels.index(label)] if posterior and labels is not None else None,
                "answers": len(s.answers),
                "annotators": sorted(s.answers),
                "answer_labels": [s.answers[a] for a in sorted(s.answers)],
                "queues": sorted(s.queues),
                "title": s.title,
                "thumbnail": s.thumbnail,
                "model_score": s.model_score,
            }
        )
    return Candidate(task, pl.DataFrame(rows, schema=SCHEMA).sort("key"), quality, model)


def write_release(lake_root: Path, found: Candidate, checks: dict) -> tuple[Release, bool]:
    """Write the next version, or return the newest one when its labels are the same (False)."""
    newest = newest_release(lake_root, found.task.spec.name)
    if newest is not None and newest.manifest()["content_hash"] == found.content_hash:
        return newest, False
    version = newest.version + 1 if newest else 1
    parent = releases_dir(lake_root, found.task.spec.name)
    parent.mkdir(parents=True, exist_ok=True)
    release = Release(found.task.spec.name, version, parent / f"v{version:04d}")
    staging = Path(tempfile.mkdtemp(prefix=f".{release.name}-", dir=parent))
    try:
        found.labels.write_parquet(staging / LABELS_FILE)
        manifest = _manifest(found, release, checks)
        (staging / LABEL_STUDIO_FILE).write_text(json.dumps(label_studio_tasks(found), indent=1))
        (staging / CARD_FILE).write_text(dataset_card(found, manifest))
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
        _claim_version(release)
        # replaces only the empty folder just claimed; readers skip a folder until its manifest is there
        os.rename(staging, release.folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return release, True


def _claim_version(release: Release) -> None:
    """Make the version's folder, failing if it exists: os.rename alone silently replaces an empty folder
    (a crashed writer's, or another writer's claim), and a release is never replaced."""
    try:
        release.folder.mkdir()
    except FileExistsError as error:
        raise FileExistsError(
            f"release folder {release.folder} exists without a manifest: a release is never replaced "
            "(remove the folder if it is a crashed write's)"
        ) from error


def _manifest(found: Candidate, release: Release, checks: dict) -> dict:
    queues = found.labels.explode("queues")["queues"].value_counts()
    return {
        "task": found.task.spec.name,
        "version": release.version,
        "created_at": datetime.now(UTC).isoformat(),
        "content_hash": found.content_hash,
        "items": found.labels.height,
        "resolved_by": dict(found.labels["resolved_by"].value_counts().iter_rows()),
        "class_balance": found.class_balance(),
        "class_counts": dict(found.labels["label"].value_counts().iter_rows()),
        "agreement": {
            "krippendorff_alpha": found.quality.krippendorff_alpha,
            "krippendorff_alpha_interval": [
                found.quality.krippendorff_alpha_low,
                found.quality.krippendorff_alpha_high,
            ],
            "interval": "95% percentile bootstrap over items",
            "fleiss_kappa": found.quality.fleiss_kappa,
        },
        "method": found.model.method if found.model else None,
        "annotator_model": found.model.to_json() if found.model else None,
        "answers": found.quality.answers,
        "annotators": [asdict(a) for a in found.quality.annotators],
        "flagged_annotators": [a.annotator for a in found.quality.annotators if a.flagged],
        "source_queues": dict(queues.iter_rows()),
        "task_spec": found.task.spec.model_dump(mode="json"),
        "checks": checks,
    }


def dataset_card(found: Candidate, manifest: dict) -> str:
    spec = found.task.spec
    balance = ", ".join(f"{k} {v:.1%}" for k, v in sorted(manifest["class_balance"].items()))
    alpha = manifest["agreement"]["krippendorff_alpha"]
    low, high = manifest["agreement"]["krippendorff_alpha_interval"]
    interval = "" if low is None else f" (95% bootstrap interval {low:.3f}-{high:.3f})"
    return f"""# {spec.name} v{manifest["version"]:04d}

{spec.question}

- Items: {manifest["items"]} ({", ".join(f"{k}: {v}" for k, v in manifest["resolved_by"].items())})
- Labels: {balance}
- Answers per item: {spec.answers_rule}; annotators: {len(manifest["annotators"])}
- Krippendorff's alpha: {"n/a" if alpha is None else f"{alpha:.3f}"}{interval}
- Annotator model: {manifest["method"] or "none (free text)"}; answers: {manifest["answers"]}; flagged annotators: \
{", ".join(manifest["flagged_annotators"]) or "none"}
- Source queues: {", ".join(f"{k} {v}" for k, v in sorted(manifest["source_queues"].items()))}
- Content hash (sha256 of sorted key, label): {manifest["content_hash"]}

A label is a reviewer's verdict, else the annotator model's most likely label when its posterior
(column `posterior`) reaches {spec.confidence}, else the unanimous answer of the item's annotators.
Gold questions are not part of the release. Instructions given to annotators:

> {spec.instructions or "(none)"}
"""


def label_studio_tasks(found: Candidate) -> list[dict]:
    """Label Studio's JSON import: one task per item, each annotator's answer as an annotation and the
    resolved label as the ground-truth annotation."""
    tasks = []
    for row in found.labels.iter_rows(named=True):

        def choice(label: str, ground_truth: bool, who: str) -> dict:
            return {
                "ground_truth": ground_truth,
                "completed_by": who,
                "result": [{"from_name": "label", "to_name": "item", "type": "choices", "value": {"choices": [label]}}],
            }

        tasks.append(
            {
                "data": {"key": row["key"], "title": row["title"], "image": row["thumbnail"]},
                "annotations": [
                    choice(label, False, who)
                    for who, label in zip(row["annotators"], row["answer_labels"], strict=True)
                ]
                + [choice(row["label"], True, row["resolved_by"])],
            }
        )
    return tasks
