"""Load one day of a landing stream into the warehouse.

Each landing file is validated whole against the source's schema (feature_defs.sources). A bad
file is quarantined with a message naming the file and the problem and contributes nothing; the
other files of the day still load. Rows are de-duplicated by the source key, so re-delivered
files and re-runs do not create duplicates.

Re-deliveries: when the same key arrives more than once with different content, the newest
delivery wins, by arrival order (`Lake.landing_files_by_arrival`: the file's landing time, then its
name; within a file, the later line). The order is recorded in the ingest report. The streaming
backfill stages landing files by the same rule (engines.streaming.stage_landing), so a correction
that moves an event's timestamp changes the warehouse and the streaming history alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from engines.data.lake import Lake
from feature_defs.compile.polars import POLARS_TYPES
from feature_defs.dsl import Source


class LandingFileError(ValueError):
    """A landing file that cannot be loaded. The message names the file and the problem."""


@dataclass
class IngestReport:
    source: str
    day: date
    rows: int = 0
    files_loaded: list[str] = field(default_factory=list)
    quarantined: dict[str, str] = field(default_factory=dict)  # file name -> problem
    duplicate_rows: int = 0


def empty_frame(source: Source) -> pl.DataFrame:
    return pl.DataFrame(schema={c: POLARS_TYPES[t] for c, t in source.schema.items()})


def read_landing_file(path: Path, source: Source, day: date) -> pl.DataFrame:
    """Parse and validate one file; raise LandingFileError naming the file and the problem."""
    try:
        raw = _read_raw(path)
    except LandingFileError:
        raise
    except Exception as exc:  # a corrupt Parquet footer, an unreadable file, ...
        raise LandingFileError(f"{path.name}: cannot be read as {path.suffix[1:]}: {exc}") from exc

    missing = [c for c in source.schema if c not in raw.columns]
    if missing:
        raise LandingFileError(
            f"{path.name}: missing column(s) {', '.join(missing)} required by source {source.name!r}"
        )

    columns = []
    for name, dtype in source.schema.items():
        try:
            columns.append(_cast(raw.get_column(name), dtype))
        except Exception as exc:
            raise LandingFileError(
                f"{path.name}: column {name!r} cannot be read as {dtype} ({raw.schema[name]}): {exc}"
            ) from None
    frame = pl.DataFrame(columns)

    key_nulls = frame.get_column(source.key).null_count() if source.key else 0
    if key_nulls:
        raise LandingFileError(f"{path.name}: {key_nulls} row(s) have no {source.key}")
    ts = frame.get_column(source.timestamp_field)
    start = datetime.combine(day, time(), tzinfo=UTC)
    end = start + timedelta(days=1)
    if source.kind == "events":
        outside = frame.filter(ts.is_null() | (ts < start) | (ts >= end)).height
        rule = f"outside {day.isoformat()} (UTC); an event file in date={day.isoformat()} holds that day's events only"
    else:  # a dimension's day may deliver rows changed earlier (the first delivery is a full snapshot)
        outside = frame.filter(ts.is_null() | (ts >= end)).height
        rule = f"after {day.isoformat()} (UTC); a file in date={day.isoformat()} cannot hold later changes"
    if outside:
        raise LandingFileError(f"{path.name}: {outside} row(s) have no {source.timestamp_field} or one {rule}")
    return frame


def load_day(lake: Lake, source: Source, day: date) -> tuple[pl.DataFrame, IngestReport]:
    """Read, validate and de-duplicate one day of `source` from landing, quarantining bad files.
    Nothing is written to the warehouse: the caller writes after its data-quality gate."""
    report = IngestReport(source.name, day)
    files = lake.landing_files_by_arrival(source.name, day)
    if not files and not lake.quarantined_files(source.name, day):
        raise FileNotFoundError(
            f"no landing files for {source.name!r} on {day.isoformat()} in {lake.landing_dir(source.name, day)}"
        )
    frames = []
    for path in files:  # arrival order: a later delivery of a key replaces an earlier one
        try:
            frame = read_landing_file(path, source, day)
            frames.append(frame.with_columns(pl.lit(len(frames)).alias("_file")).with_row_index("_line"))
            report.files_loaded.append(path.name)
        except LandingFileError as exc:
            lake.quarantine(path, source.name, day, str(exc))
            report.quarantined[path.name] = str(exc)

    combined = pl.concat(frames) if frames else empty_frame(source)
    if frames:
        combined = combined.sort("_file", "_line").drop("_file", "_line")
    deduped = combined.unique(subset=[source.key], keep="last", maintain_order=True).sort(
        source.timestamp_field, source.key
    )
    report.duplicate_rows = combined.height - deduped.height
    report.rows = deduped.height
    return deduped, report


def write_day(lake: Lake, source: Source, day: date, frame: pl.DataFrame) -> Path:
    return lake.write_partition("warehouse", source.name, day, frame)


def _read_raw(path: Path) -> pl.DataFrame:
    if path.suffix == ".parquet":
        return pl.from_arrow(pq.read_table(path))
    rows = []
    with path.open() as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LandingFileError(f"{path.name}: line {n} is not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise LandingFileError(f"{path.name}: line {n} is not a JSON object")
            rows.append(row)
    # infer types from every row: a late odd value must fail the cast, not be silently dropped
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()


def _cast(series: pl.Series, dtype: str) -> pl.Series:
    target = POLARS_TYPES[dtype]
    if dtype == "timestamp":
        if series.dtype == pl.String:
            return series.str.to_datetime(time_zone="UTC", time_unit="us", strict=True)
        if isinstance(series.dtype, pl.Datetime):
            if series.dtype.time_zone is None:
                return series.dt.replace_time_zone("UTC").dt.cast_time_unit("us")
            return series.dt.convert_time_zone("UTC").dt.cast_time_unit("us")
        raise TypeError(f"{series.dtype} is not a timestamp")
    if series.dtype == pl.Null:
        return series.cast(target)
    if dtype in ("int64", "float64") and series.dtype in (pl.String, pl.Boolean):
        raise TypeError(f"{series.dtype} is not numeric")
    if dtype == "string" and series.dtype != pl.String:
        raise TypeError(f"{series.dtype} is not text")
    if dtype == "int64" and series.dtype.is_float():
        raise TypeError("has fractional numbers")
    return series.cast(target, strict=True)
