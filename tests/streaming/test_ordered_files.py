"""Our Flink connector `ordered-files` (jobs/flink/connectors), read by a real Flink job in
.venv-flink: it hands out files in arrival order, and the fields it extracts from each line equal
Flink's own JSON_VALUE and IS JSON OBJECT on the same line (computed by the same query), but for
a line with text after its object, which ours counts as no JSON object (malformed)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from engines.streaming import SourceOptions, StreamingJobSettings
from engines.streaming.job import CONNECTORS_JAR, DEFAULT_FLINK_PYTHON, FlinkJob, StreamingJobError

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


def test_files_in_arrival_order_and_fields_as_json_value_reads_them(tmp_path):
    folder = tmp_path / "events"
    folder.mkdir()
    for k, line in enumerate(LINES):  # file k arrives k-th but its name sorts last-first
        path = folder / f"events-{len(LINES) - k:03d}.jsonl"
        path.write_text(line + "\n")
        os.utime(path, ns=(1_700_000_000_000_000_000 + k * 10**9,) * 2)
    jar = Path(DEFAULT_FLINK_PYTHON).parents[1] / CONNECTORS_JAR
    script = tmp_path / "read_back.py"
    script.write_text(textwrap.dedent(READ_BACK))
    out = subprocess.run(
        [str(DEFAULT_FLINK_PYTHON), str(script), str(folder), jar.resolve().as_uri(), json.dumps(FIELDS)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JVM_ARGS": "-Xmx512m"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]
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
