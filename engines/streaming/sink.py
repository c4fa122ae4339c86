"""The bridge between Flink and the online store: a directory per view where Flink's filesystem
sink commits JSON-lines files at checkpoints (in-progress files are hidden), and the job's own
counts (lines read, malformed, late), folded into a totals file as they age."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import orjson

LONG_DIGIT_RUN = re.compile(rb"\d{19}")  # the shortest integers beyond 64 bits have 19 digits
TOTALS_FILE = "_totals.json"  # in the metrics sink: the counts of metric files folded in and deleted


def committed_files(folder: Path) -> list[Path]:
    """Files the sink has committed (in-progress ones are hidden, named .part-...), in name order."""
    return [folder / name for name in committed_names(folder)]


def committed_names(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(folder) if entry.name.startswith("part-"))
    except FileNotFoundError:
        return []


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [_loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _loads(line: bytes) -> Any:
    """orjson: the pusher parses a row per event with live rows, and json.loads took most of its
    time at 20,000 events/s (py-spy). A line orjson refuses (NaN, Infinity) or may read otherwise
    (it reads an integer beyond 64 bits as a float) is read as the json module reads it."""
    if LONG_DIGIT_RUN.search(line) is None:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    return json.loads(line)


def read_committed_rows(folder: Path) -> list[dict[str, Any]]:
    return [row for path in committed_files(folder) for row in read_rows(path)]


def job_metrics(folder: Path) -> dict:
    """A job's counts from its metrics sink: the folded totals plus every committed file not folded."""
    while True:
        paths = committed_files(folder)  # before the totals: a file folded meanwhile is then named there
        base = _read_totals(folder)
        try:
            rows = [row for path in paths if path.name not in base["folded"] for row in read_rows(path)]
        except FileNotFoundError:
            continue  # folded and deleted after the totals were read: read again
        return _add_metrics(base["totals"], rows)


def fold_metrics(folder: Path, older_than: float) -> int:
    """Adds the committed metric files older than `older_than` (epoch seconds) to the totals file,
    then deletes them. The totals file names the files it took in until they are gone, so a fold cut
    short between the two steps neither counts a file twice nor loses one. Returns files folded."""
    base = _read_totals(folder)
    for name in base["folded"]:
        (folder / name).unlink(missing_ok=True)
    old = [p for p in committed_files(folder) if p.stat().st_mtime < older_than]  # the folded ones are gone now
    if not old and not base["folded"]:
        return 0
    totals = _add_metrics(base["totals"], [row for path in old for row in read_rows(path)])
    tmp = folder / f".{TOTALS_FILE}.tmp"
    tmp.write_text(json.dumps({"totals": totals, "folded": [p.name for p in old]}))
    tmp.replace(folder / TOTALS_FILE)
    for path in old:
        path.unlink()
    return len(old)


def _read_totals(folder: Path) -> dict:
    try:
        return json.loads((folder / TOTALS_FILE).read_text())
    except FileNotFoundError:
        return {"totals": {"records": 0, "malformed": 0, "late": 0, "newest_event_time": None}, "folded": []}


def _add_metrics(totals: dict, rows: list[dict]) -> dict:
    totals = dict(totals)
    for row in rows:
        for key in ("records", "malformed", "late"):
            totals[key] += row.get(key) or 0
        if row.get("max_event_time") and (totals["newest_event_time"] or "") < row["max_event_time"]:
            totals["newest_event_time"] = row["max_event_time"]
    return totals
