"""Our Flink connector `ordered-files` (jobs/flink/connectors), read by a real Flink job in
.venv-flink: it hands out files in arrival order, and the fields it extracts from each line equal
Flink's own JSON_VALUE and IS JSON OBJECT on the same line (computed by the same query), but for
a line with text after its object, which ours counts as no JSON object (malformed). A field
declared TIMESTAMP(3) is read as the instant its ISO-8601 text names, as the SQL that Kafka sources
use (feature_defs.compile.flink._timestamp_of) and as polars reads it in the batch path."""

from __future__ import annotations

import json
import os
import random
import subprocess
import textwrap
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from engines.streaming import SourceOptions, StreamingJobSettings
from engines.streaming.job import (
    CONNECTORS_JAR,
    DEFAULT_FLINK_PYTHON,
    SHORT_LIVED_JVM_OPTIONS,
    FlinkJob,
    StreamingJobError,
)
from feature_defs.compile.flink import _timestamp_of

FIELDS = ["s", "n", "f", "b", "z", "o"]
LINES = [
    '{"s": "text", "n": 3, "f": 2.50, "b": true, "z": null, "o": {"k": 1}}',
    '{"s": "caf\\u00e9 \\"quoted\\"", "n": -12, "f": 1e3, "b": false, "o": [1, 2]}',
    '{"n": 3.0, "f": -0.0, "s": 17}',
    '{"s": "", "n": 9223372036854775807, "f": 1.5E-7}',
    '{"s": "dup", "s": "last"}',
    "[1, 2, 3]",
    '"just a string"',
    '{"s": "broken',
    "",
    "{}",
    '{"s": "x"} and more',
]
TRAILING = LINES[-1]  # no JSON line: Flink's JSON functions read the object and ignore the rest
# One Flink process reads both tables (a JVM start is most of a read's cost). `fields`: the lines of
# LINES, read by one reader; their names sort against arrival, so only the modification time can
# order them. `timestamps`: a `$.ts` declared TIMESTAMP(3) beside the Kafka sources' SQL on the same text.
READ_BACK = """
import json, sys
from pyflink.table import EnvironmentSettings, TableEnvironment
jar, fields_folder, fields, ts_folder, ts_sql = sys.argv[1:6]
fields = json.loads(fields)
env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
env.get_config().set("pipeline.jars", jar)
env.get_config().set("parallelism.default", "1")
columns = ", ".join(["line STRING", "is_json_object BOOLEAN"] + [f"`$.{f}` STRING" for f in fields])
for table, columns, folder in [
    ("field_lines", columns, fields_folder),
    ("time_lines", "line STRING, `$.ts` TIMESTAMP(3)", ts_folder),
]:
    env.execute_sql(f"CREATE TABLE {table} ({columns}) WITH ('connector' = 'ordered-files', 'path' = '{folder}')")
ours = ", ".join(f"`$.{f}`" for f in fields)
flinks = ", ".join(f"JSON_VALUE(line, '$.{f}')" for f in fields)
queries = {
    "fields": f"SELECT line, is_json_object, line IS JSON OBJECT, {ours}, {flinks} FROM field_lines",
    "timestamps": f"SELECT line, CAST(`$.ts` AS STRING), CAST({ts_sql} AS STRING) FROM time_lines",
}
for name, query in queries.items():
    with env.execute_sql(query).collect() as rows:
        for row in rows:
            print(json.dumps([name, *row]))
"""


@pytest.fixture(scope="module")
def read_back(tmp_path_factory) -> dict[str, list[list]]:
    """The rows Flink reads from both folders (see READ_BACK), by query."""
    root = tmp_path_factory.mktemp("ordered_files")
    fields_folder, ts_folder = root / "fields", root / "timestamps"
    write_lines_in_arrival_order(fields_folder)
    ts_folder.mkdir()
    lines = [json.dumps({"ts": t}) for t in TIMESTAMP_TEXTS] + ['{"ts": 17}']  # a number is no ISO-8601 text
    (ts_folder / "events.jsonl").write_text("".join(line + "\n" for line in lines))
    script = root / "read_back.py"
    script.write_text(textwrap.dedent(READ_BACK))
    jar = (Path(DEFAULT_FLINK_PYTHON).parents[1] / CONNECTORS_JAR).resolve().as_uri()
    ts_sql = _timestamp_of("JSON_VALUE(line, '$.ts')")
    out = subprocess.run(
        [str(DEFAULT_FLINK_PYTHON), str(script), jar, str(fields_folder), json.dumps(FIELDS), str(ts_folder), ts_sql],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JVM_ARGS": f"-Xmx512m {SHORT_LIVED_JVM_OPTIONS}"},  # a read of seconds
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows: dict[str, list[list]] = {"fields": [], "timestamps": []}
    for line in out.stdout.splitlines():
        if line.startswith("["):
            name, *row = json.loads(line)
            rows[name].append(row)
    return rows


def write_lines_in_arrival_order(folder: Path) -> None:
    folder.mkdir()
    for k, line in enumerate(LINES):  # file k arrives k-th but its name sorts last-first
        path = folder / f"events-{len(LINES) - k:03d}.jsonl"
        path.write_text(line + "\n")
        os.utime(path, ns=(1_700_000_000_000_000_000 + k * 10**9,) * 2)


@pytest.mark.services  # a Flink job in .venv-flink
def test_files_in_arrival_order_and_fields_as_json_value_reads_them(read_back):
    rows = read_back["fields"]
    assert [r[0] for r in rows] == LINES  # arrival order
    n = len(FIELDS)
    for line, is_object, flink_is_object, *values in rows:
        ours, flinks = values[:n], values[n:]
        assert is_object == (line.startswith("{") and line not in ('{"s": "broken', TRAILING)), line
        assert is_object == flink_is_object or line == TRAILING
        assert ours == (flinks if is_object else [None] * n), line
    assert rows[0][3:6] == ["text", "3", "2.50"]  # a number's own text, as JSON_VALUE gives it


def test_a_job_refuses_to_start_without_our_connectors(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"  # a Flink environment set up before the connectors
    python.parent.mkdir(parents=True)
    python.touch()
    job = FlinkJob(
        StreamingJobSettings("interactions", tmp_path / "job", SourceOptions(path=str(tmp_path)), flink_python=python)
    )
    with pytest.raises(StreamingJobError, match="mlplane-connectors.jar are missing: run scripts/setup-flink"):
        job.command()


IMPOSSIBLE = [  # Flink's cast alone moves the first four (to the 28th, the next day) and takes the offsets
    "2026-02-30T10:00:00Z",
    "2026-02-29T00:00:00Z",
    "2026-01-05T24:00:00Z",
    "2026-13-05T10:00:00Z",
    "2026-01-05T10:60:00Z",
    "2026-01-05T10:00:00+25:00",
    "2026-01-05T10:00:00+02:60",
    "２０２６-01-05T10:00:00Z",
    "2026-01-05t10:00:00z",
    "2026-01-05T10:00:00.+02:00",
    "2026-01-05T10:00:00Z ",
]
# shapes polars reads (one at a time) that the streaming grammar counts as malformed; the last is
# past the year 9999 in UTC (polars gives the year 10000, which Python's datetime cannot hold)
POLARS_ONLY = [
    "2026-01-05T23:59:60Z",
    "2026-01-05T10:00Z",
    "2026-01-05",
    " 2026-01-05T10:00:00Z",
    "2026-01-05T10:00:00+02",
]
BEYOND_9999 = "9999-12-31T23:59:59.999-05:00"
POSSIBLE = ["2024-02-29T23:59:59.9999Z", "0001-01-01T00:00:00Z", "2026-01-05 10:00:00", "2026-01-05T10:00:00.123456789"]


def _random_timestamps(n: int, rng: random.Random) -> list[str]:
    """ISO-8601 texts of random instants (1970-2100): any offset, 'T' or a space, 0-9 fraction digits."""
    out = []
    for _ in range(n):
        instant = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(130 * 365 * 86_400 * 10**6))
        minutes = rng.choice([0, 0, 120, -330, 345, 840, -720, rng.randrange(-23 * 60, 23 * 60)])
        local = instant.astimezone(timezone(timedelta(minutes=minutes)))
        digits = rng.choice([0, 0, 1, 3, 6, 9])
        fraction = ("." + f"{local.microsecond:06d}{rng.randrange(1000):03d}"[:digits]) if digits else ""
        sign, size = ("-" if minutes < 0 else "+"), abs(minutes)
        hh, mm = f"{size // 60:02d}", f"{size % 60:02d}"
        zone = rng.choice(["Z", "", "+00:00"]) if minutes == 0 else rng.choice([f"{sign}{hh}:{mm}", f"{sign}{hh}{mm}"])
        out.append(local.strftime("%Y-%m-%d") + rng.choice("T ") + local.strftime("%H:%M:%S") + fraction + zone)
    return out


TIMESTAMP_TEXTS = IMPOSSIBLE + POLARS_ONLY + [BEYOND_9999] + POSSIBLE + _random_timestamps(300, random.Random(17))


def _polars_instant(text: str) -> str | None:
    """How polars (engines.data.ingest) reads the text, cut to milliseconds; None where it refuses it."""
    try:
        value = pl.Series([text]).str.to_datetime(time_zone="UTC", time_unit="us", strict=True)[0]
    except pl.exceptions.PolarsError:
        return None
    return value.replace(tzinfo=None, microsecond=value.microsecond // 1000 * 1000).isoformat(" ", "milliseconds")


@pytest.mark.services  # a Flink job in .venv-flink
def test_timestamps_read_as_the_sql_and_polars_read_them(read_back):
    texts, rows = TIMESTAMP_TEXTS, read_back["timestamps"]
    assert len(rows) == len(texts) + 1
    ours = {json.loads(line)["ts"]: (our, sqls) for line, our, sqls in rows}
    assert ours[17] == (None, None)  # a number is no ISO-8601 text
    for text in texts:
        our, sqls = ours[text]
        assert our == sqls, text  # the file source reads a timestamp as the Kafka sources' SQL does
        if text in IMPOSSIBLE or text in POLARS_ONLY or text == BEYOND_9999:
            assert our is None, text
        else:
            assert our is not None and our == _polars_instant(text), text
    assert [_polars_instant(t) for t in IMPOSSIBLE] == [None] * len(IMPOSSIBLE)
    assert None not in [_polars_instant(t) for t in POLARS_ONLY]
