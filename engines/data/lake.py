"""The project's data lake on a local (or mounted) filesystem: landing, warehouse, offline
feature tables and datasets, each a folder of daily Parquet partitions.

Partitions are written atomically (temporary file then rename), so a failed run leaves the
previous partition intact and a re-run replaces it whole: no duplicate rows.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

LANDING_SUFFIXES = (".parquet", ".jsonl")

def to_jsonl(table: pa.Table) -> str:
    """One JSON object per row; timestamps as ISO-8601 UTC strings ending in Z, nulls as null."""
    columns = []
    for column in table.columns:
        if pa.types.is_timestamp(column.type):
            text = np.datetime_as_string(column.to_numpy(), unit="us")
            columns.append([None if t == "NaT" else t + "Z" for t in text])
        else:
            columns.append(column.to_pylist())
    names = table.column_names
    return "".join(json.dumps(dict(zip(names, row))) + "\n" for row in zip(*columns))


def partition_dir_name(day: date) -> str:
    return f"date={day.isoformat()}"


@dataclass(frozen=True)
class Lake:
    root: Path

    # --- landing (written by upstream systems) ---------------------------------------------
    def landing_dir(self, stream: str, day: date) -> Path:
        return self.root / "landing" / stream / partition_dir_name(day)

    def landing_files(self, stream: str, day: date) -> list[Path]:
        folder = self.landing_dir(stream, day)
        if not folder.is_dir():
            return []
        return sorted(
            p for p in folder.iterdir() if p.is_file() and p.suffix in LANDING_SUFFIXES and not p.name.startswith(".")
        )

    def landing_files_by_arrival(self, stream: str, day: date) -> list[Path]:
        """The day's landing files in arrival order: by the time the file landed (its modification
        time), then by name. Re-deliveries resolve by it: the newest delivery of an id wins, in the
        warehouse (ingest) and in the streaming backfill's staging alike."""
        return sorted(self.landing_files(stream, day), key=lambda p: (p.stat().st_mtime_ns, p.name))

    def landing_days(self, stream: str) -> list[date]:
        folder = self.root / "landing" / stream
        if not folder.is_dir():
            return []
        return sorted(date.fromisoformat(p.name.removeprefix("date=")) for p in folder.glob("date=*") if p.is_dir())

    def quarantine(self, path: Path, stream: str, day: date, problem: str) -> Path:
        """Move a bad landing file aside, with the reason next to it."""
        target_dir = self.root / "quarantine" / stream / partition_dir_name(day)
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / path.name
        shutil.move(path, target)
        target.with_name(target.name + ".error.txt").write_text(problem + "\n")
        return target

    def quarantined_files(self, stream: str, day: date) -> list[Path]:
        folder = self.root / "quarantine" / stream / partition_dir_name(day)
        return sorted(p for p in folder.glob("*") if p.suffix in LANDING_SUFFIXES) if folder.is_dir() else []

    # --- managed tables ----------------------------------------------------------------------
    def table_dir(self, zone: str, table: str) -> Path:
        return self.root / zone / table

    def partition_path(self, zone: str, table: str, day: date) -> Path:
        return self.table_dir(zone, table) / partition_dir_name(day) / "part-0.parquet"

    def write_partition(self, zone: str, table: str, day: date, frame: pl.DataFrame) -> Path:
        path = self.partition_path(zone, table, day)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{uuid.uuid4().hex}.tmp")
        try:
            frame.write_parquet(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def partition_days(self, zone: str, table: str) -> list[date]:
        folder = self.table_dir(zone, table)
        return (
            sorted(
                date.fromisoformat(p.parent.name.removeprefix("date=")) for p in folder.glob("date=*/part-0.parquet")
            )
            if folder.is_dir()
            else []
        )

    def read_partition(self, zone: str, table: str, day: date) -> pl.DataFrame:
        path = self.partition_path(zone, table, day)
        if not path.exists():
            raise FileNotFoundError(f"partition {zone}/{table}/{partition_dir_name(day)} does not exist ({path})")
        return pl.read_parquet(path)

    def scan_partitions(self, zone: str, table: str, days: list[date]) -> pl.LazyFrame | None:
        """The given days' partitions as one frame; None when none of them exist."""
        paths = [self.partition_path(zone, table, d) for d in days]
        paths = [p for p in paths if p.exists()]
        return pl.scan_parquet(paths) if paths else None
