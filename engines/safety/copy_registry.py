"""The copy detector in the model registry: each calibration (model, threshold, estimates) the flags fit
on a content_violation release is a version of `copy_detector`, tagged with the release that fed it
(engines.data.releases.releases_tag, as every model a release fed), so the registry answers which
human labels a detector was trained on. A calibration equal to the newest version's registers nothing:
the flags recalibrate every day, and an unchanged release and catalogue give the same model.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from engines.data.releases import Release, releases_tag
from engines.safety.copy_calibration import Calibration

if TYPE_CHECKING:  # MLflow loads with the registry, only where one is used
    from engines.models.registry import ModelRegistry, RegisteredVersion

MODEL_NAME = "copy_detector"
MODEL_FILE = "calibration.json"
CALIBRATION_TAG = "mlplane.calibration_sha256"  # what tells an unchanged calibration from a new one


def calibration_json(calibration: Calibration) -> str:
    return json.dumps(asdict(calibration), indent=2, sort_keys=True)


def calibration_metrics(calibration: Calibration) -> dict[str, float]:
    """The threshold and the cross-validated estimates with their intervals (those that exist)."""
    metrics = {"threshold": calibration.threshold, "labelled_items": float(calibration.labelled_items)}
    for name in ("precision", "recall", "false_positive_rate", "prevalence"):
        estimate = getattr(calibration, name)
        for suffix, value in (("", estimate.value), ("_low", estimate.low), ("_high", estimate.high)):
            if value is not None:
                metrics[f"cv_{name}{suffix}"] = float(value)
    return metrics


def register_calibration(
    registry: ModelRegistry, calibration: Calibration, release: Release, lineage: dict[str, str]
) -> tuple[RegisteredVersion, bool]:
    """The registry version of `calibration`, fitted on `release`, and whether this call registered it
    (False: the newest version is this calibration already). `lineage`: the caller's own tags (code
    version, run, asset)."""
    if calibration.release != release.name:
        raise ValueError(f"the calibration was fitted on {calibration.release}, not {release.lineage}")
    text = calibration_json(calibration)
    checksum = hashlib.sha256(text.encode()).hexdigest()
    versions = registry.versions(MODEL_NAME)
    if versions and versions[-1].tags.get(CALIBRATION_TAG) == checksum:
        return versions[-1], False
    tags = {**lineage, **releases_tag(release), CALIBRATION_TAG: checksum}
    with tempfile.TemporaryDirectory(prefix="copy-detector-") as work:
        (Path(work) / MODEL_FILE).write_text(text)
        return registry.register(MODEL_NAME, Path(work), tags, calibration_metrics(calibration)), True


def newest_calibration(registry: ModelRegistry, work: Path) -> tuple[Calibration, RegisteredVersion] | None:
    """The newest registered calibration (what the flags asset fitted last) and its version, downloaded into
    `work` and verified against its checksums; None before the first release calibrated one."""
    versions = registry.versions(MODEL_NAME)
    if not versions:
        return None
    newest = versions[-1]
    folder = registry.load(MODEL_NAME, newest.version, work / f"{MODEL_NAME}-v{newest.version}")
    return Calibration.read(folder / MODEL_FILE), newest
