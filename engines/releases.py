"""Where ground-truth releases live, for their readers (the violation detector, calibration).
The ground_truth package writes them; a release folder is immutable once written.

    <lake>/ground_truth/<task>/releases/v0001/labels.parquet, manifest.json, README.md, label_studio.json
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
