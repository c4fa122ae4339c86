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
from engines.streaming.job import CONNECTORS_JAR, DEFAULT_FLINK_PYTHON, FlinkJob, StreamingJobError
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
# read by one reader; names sort against arrival, so only the modification time can order them
READ_BACK = """
import json, sys
from pyflink.table import EnvironmentSettings, TableEnvironment
folder, jar, fields = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
env.get_config().set("pipeline.jars", jar)
env.get_config().set("parallelism.default", "1")
columns = ", ".join(["line STRING", "is_json_object BOOLEAN"] + [f"`$.{f}` STRING" for f in fields])
env.execute_sql(f"CREATE TABLE t ({columns}) WITH ('connector' = 'ordered-files', 'path' = '{folder}')")
ours = ", ".join(f"`$.{f}`" for f in fields)
flinks = ", ".join(f"JSON_VALUE(line, '$.{f}')" for f in fields)
query = f"SELECT line, is_json_object, line IS JSON OBJECT, {ours}, {flinks} FROM t"
with env.execute_sql(query).collect() as rows:
    for row in rows:
        print(json.dumps(list(row)))
"""


def _read_in_flink(script: str, tmp_path: Path, folder: Path, argument: str) -> list[list]:
    """Runs a read-back script (FOLDER, our connectors' JAR, ARGUMENT) in .venv-flink; its rows."""
    path = tmp_path / "read_back.py"
    path.write_text(textwrap.dedent(script))
    jar = (Path(DEFAULT_FLINK_PYTHON).parents[1] / CONNECTORS_JAR).resolve().as_uri()
    out = subprocess.run(
        [str(DEFAULT_FLINK_PYTHON), str(path), str(folder), jar, argument],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JVM_ARGS": "-Xmx512m"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]


@pytest.mark.services  # a Flink job in .venv-flink
def test_files_in_arrival_order_and_fields_as_json_value_reads_them(tmp_path):
    folder = tmp_path / "events"
    folder.mkdir()
    for k, line in enumerate(LINES):  # file k arrives k-th but its name sorts last-first
        path = folder / f"events-{len(LINES) - k:03d}.jsonl"
        path.write_text(line + "\n")
        os.utime(path, ns=(1_700_000_000_000_000_000 + k * 10**9,) * 2)
    rows = _read_in_flink(READ_BACK, tmp_path, folder, json.dumps(FIELDS))
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
READ_TIMESTAMPS = """
import json, sys
from pyflink.table import EnvironmentSettings, TableEnvironment
folder, jar, sql = sys.argv[1], sys.argv[2], sys.argv[3]
env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
env.get_config().set("pipeline.jars", jar)
env.get_config().set("parallelism.default", "1")
columns = "line STRING, `$.ts` TIMESTAMP(3)"
env.execute_sql(f"CREATE TABLE t ({columns}) WITH ('connector' = 'ordered-files', 'path' = '{folder}')")
with env.execute_sql(f"SELECT line, CAST(`$.ts` AS STRING), CAST({sql} AS STRING) FROM t").collect() as rows:
    for row in rows:
        print(json.dumps(list(row)))
"""


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


def _polars_instant(text: str) -> str | None:
    """How polars (engines.ingest) reads the text, cut to milliseconds; None where it refuses it."""
    try:
        value = pl.Series([text]).str.to_datetime(time_zone="UTC", time_unit="us", strict=True)[0]
    except pl.exceptions.PolarsError:
        return None
    return value.replace(tzinfo=None, microsecond=value.microsecond // 1000 * 1000).isoformat(" ", "milliseconds")


@pytest.mark.services  # a Flink job in .venv-flink
def test_timestamps_read_as_the_sql_and_polars_read_them(tmp_path):
    texts = IMPOSSIBLE + POLARS_ONLY + [BEYOND_9999] + POSSIBLE + _random_timestamps(300, random.Random(17))
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "events.jsonl").write_text("".join(json.dumps({"ts": t}) + "\n" for t in texts) + '{"ts": 17}\n')
    rows = _read_in_flink(READ_TIMESTAMPS, tmp_path, folder, _timestamp_of("JSON_VALUE(line, '$.ts')"))
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
