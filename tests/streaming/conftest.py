"""One real streaming run shared by the streaming tests (a Flink mini-cluster costs half a minute
to start on this machine): the simulator appends a day of interactions, plus the first hours of
the next, as JSON-lines files; the Flink job compiled from the DSL computes the streaming views;
the job is killed half-way and restarted from its checkpoint; late and malformed lines arrive;
the pusher applies every committed result to a copy of the pipeline's online store (Feast SQLite),
which already holds the batch features."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from datetime import time as day_time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings
from engines.streaming import (
    WINDOW_END,
    ClusterJob,
    ClusterSettings,
    FlinkJob,
    JobHealth,
    OnlinePusher,
    SourceOptions,
    StandaloneCluster,
    StreamingJobSettings,
    read_committed_rows,
)
from engines.streaming.job import SHORT_LIVED_JVM_OPTIONS
from engines.streaming.sink import committed_files, read_rows
from feature_defs.compile.polars import TIMESTAMP, build_rows_at
from feature_defs.dsl import Aggregation
from simulator import Simulator
from simulator.stream import EventStream, malformed_lines
from tests.conftest import LAST_DAY, SMALL

STREAM_DAY = LAST_DAY + timedelta(days=1)  # the day after the batch pipeline's last day
SLIDE = 900  # 15-minute hops over the 1-hour windows
WATERMARK_DELAY = 300  # files arrive in time order (see append_in_chunks)
TIMEOUT = 300  # seconds; generous, the machine is shared
# between checks of a wait: every wait is on the tests' path, and a check (a status file, a folder
# listing) costs far less than the time a longer interval adds after the condition came true
POLL_SECONDS = 0.25


@dataclass
class StreamingRun:
    job: FlinkJob
    engine: FeatureStoreEngine
    pusher: OnlinePusher
    streamed: pa.Table  # every well-formed, on-time event appended
    lines_appended: int
    late_events: int
    malformed_events: int
    health_after_kill: JobHealth
    checkpoint_restored: Path | None
    health_at_end: JobHealth


def wait_until(
    condition,
    what: str,
    timeout: float = TIMEOUT,
    pusher: OnlinePusher | None = None,
    explain: Callable[[], str] | None = None,
):
    """`condition()`'s first true value; a timeout says what it waited for, and `explain()` if given."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pusher:
            pusher.poll()
        if value := condition():
            return value
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f"; {explain()}" if explain else ""))


def wait_for_records(job: FlinkJob | ClusterJob, total: int, what: str, pusher: OnlinePusher | None = None) -> None:
    """Waits until the job's committed counts say `total` lines were read. Fails at once when the
    job is no longer healthy or counts more (lines read twice); every failure says where the job stood and
    ends with its Flink log's warnings, so a hang on a loaded CI machine names its cause."""

    def all_read() -> bool:
        health = job.health()
        if not health.healthy or health.records > total:
            raise AssertionError(f"{what}: {total} lines expected; {job_report(job, health)}")
        return health.records == total

    wait_until(all_read, what, pusher=pusher, explain=lambda: job_report(job, job.health()))


def job_report(job: FlinkJob | ClusterJob, health: JobHealth) -> str:
    fields = ("status", "error", "records", "late", "malformed", "checkpoint", "checkpoint_age_seconds")
    lines = [
        line
        for log in sorted(job.log_dir.glob("flink-*.log*"), reverse=True)  # .1 is the run before the newest
        for line in log.read_text(errors="replace").splitlines()
    ]
    completed = [line for line in lines if "Completed checkpoint" in line][-2:]
    warnings = [line for line in lines if " WARN " in line or " ERROR " in line][-25:]
    state = ", ".join(f"{f}={getattr(health, f)}" for f in fields)
    return state + "\nFlink log (" + str(job.log_dir) + "):\n" + "\n".join(completed + warnings)


def polars_at(view, events: pl.DataFrame, end: datetime) -> pl.DataFrame:
    """The polars batch plan's values at `end`, for the entities with events in the view's window
    before `end`: Flink emits no empty windows, while the plan also covers entities seen in the
    lookback, with zeros."""
    rows = build_rows_at(view, events.lazy(), end).collect().drop(TIMESTAMP)
    start = min(f.spec.start(end) for f in view.features if isinstance(f.spec, Aggregation))
    in_window = events.filter((pl.col("event_timestamp") >= start) & (pl.col("event_timestamp") < end))
    active = in_window.select([pl.col(view.source_column(k)).alias(k) for k in view.join_keys]).unique()
    return rows.join(active, on=view.join_keys).sort(view.join_keys)


def assert_windows_equal_polars(sink: pl.DataFrame, events: pl.DataFrame, view) -> int:
    """Every window in `sink` (rows of one view) equals the polars plan at its end; returns rows compared."""
    keys = view.join_keys
    assert sink.select([*keys, WINDOW_END]).is_duplicated().sum() == 0  # one result per entity and window
    lists = {f.name for f in view.features if view.dtype_of(f).endswith("_list")}
    compared = 0
    for end in sorted(sink[WINDOW_END].unique()):
        got = sink.filter(pl.col(WINDOW_END) == end).drop(WINDOW_END).sort(keys)
        want = polars_at(view, events, end)
        assert got[keys].to_dicts() == want[keys].to_dicts(), f"{view.name}: entities at {end}"
        for feature in view.feature_names:
            is_list = feature in lists
            assert normalised(got[feature], is_list) == normalised(want[feature], is_list), (
                f"{view.name}.{feature} at {end}"
            )
        compared += got.height
    return compared


def sink_frame(folder: Path) -> pl.DataFrame:
    frame = pl.DataFrame(read_committed_rows(folder), infer_schema_length=None)
    return frame.with_columns(pl.col(WINDOW_END).str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_zone="UTC"))


_newest_in_file: dict[Path, str] = {}  # a committed sink file never changes: each is read once


def newest_window_end(folder: Path) -> str:
    """The newest window end in `folder`'s committed rows ("" before the first). A wait checks it
    again and again while the sink grows: only the files committed since the last check are read."""
    newest = ""
    for path in committed_files(folder):
        if path not in _newest_in_file:
            _newest_in_file[path] = max((row[WINDOW_END] for row in read_rows(path)), default="")
        newest = max(newest, _newest_in_file[path])
    return newest


def normalised(values, is_list: bool = False) -> list:
    """Values compared across engines: floats rounded, a missing list as the empty list offline gives."""
    values = values.to_list() if hasattr(values, "to_list") else values
    if is_list:
        return [v or [] for v in values]
    return [round(v, 9) if isinstance(v, float) else v for v in values]


def append_in_chunks(
    stream: EventStream,
    job: FlinkJob,
    table: pa.Table,
    chunks: int,
    render: Callable[[pa.Table], list[str]] | None = None,
) -> int:
    """Append `table` in time order as `chunks` files at once, faster than the job reads them (a
    job that lags), then wait until a checkpoint holds them all. The source must read them in
    arrival order: read newest first, as Flink's own file source does, the older files' events
    would fall behind the watermark and be dropped as late. `render` writes a chunk's lines
    (default: as the simulator does)."""
    expected = job.metrics()["records"] + table.num_rows
    size = -(-table.num_rows // chunks)
    for start in range(0, table.num_rows, size):
        chunk = table.slice(start, size)
        stream.append_lines(render(chunk)) if render else stream.append(chunk)
    wait_for_records(job, expected, "the job to read the files")
    return table.num_rows


TIME_FORMS = 4  # as the simulator writes it; whole seconds at +02:00; whole seconds in UTC ('Z'); -05:30


def _form(event_id: str) -> int:
    return sum(map(ord, event_id)) % TIME_FORMS


def with_whole_seconds(table: pa.Table) -> pa.Table:
    """The events whose lines `varied_time_lines` writes without fractional seconds, cut to them."""
    times = [
        t.replace(microsecond=0) if _form(e) in (1, 2) else t
        for e, t in zip(table["event_id"].to_pylist(), table["event_timestamp"].to_pylist())
    ]
    return table.set_column(
        table.column_names.index("event_timestamp"),
        "event_timestamp",
        pa.array(times, table.schema.field("event_timestamp").type),
    )


def varied_time_lines(table: pa.Table) -> list[str]:
    """Event lines whose times are written as different producers write them, each naming the same
    instant as the table: UTC with microseconds and 'Z', with a UTC offset, without fractional
    seconds (the events of `with_whole_seconds`)."""
    forms = [
        lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        lambda t: t.astimezone(timezone(timedelta(hours=2))).isoformat(),
        lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ"),
        lambda t: t.astimezone(timezone(-timedelta(hours=5, minutes=30))).isoformat(),
    ]
    lines = []
    for row in table.to_pylist():
        time_ = row["event_timestamp"]
        assert _form(row["event_id"]) not in (1, 2) or time_.microsecond == 0, "cut it with with_whole_seconds"
        lines.append(json.dumps({**row, "event_timestamp": forms[_form(row["event_id"])](time_)}))
    return lines


def before(table: pa.Table, moment: datetime) -> pa.Table:
    return table.filter(pc.less(table["event_timestamp"], pa.scalar(moment, pa.timestamp("us", "UTC"))))


@dataclass(frozen=True)
class StreamDays:
    """The simulated events the streaming tests append (simulating them costs most of a minute)."""

    simulator: Simulator
    day: pa.Table  # STREAM_DAY's events, in event-time order
    tail: pa.Table  # the first hours of the next day


@pytest.fixture(scope="session")
def stream_days(tmp_path_factory) -> StreamDays:
    simulator = Simulator(SMALL, tmp_path_factory.mktemp("stream_sim"))
    stream = EventStream(simulator, tmp_path_factory.mktemp("unused_events"))
    next_day = STREAM_DAY + timedelta(days=1)
    return StreamDays(
        simulator,
        stream.day_events(STREAM_DAY),
        before(stream.day_events(next_day), datetime.combine(next_day, day_time(3), tzinfo=UTC)),
    )


@pytest.fixture(scope="package")
def flink_cluster(tmp_path_factory):
    """A Flink session cluster: a JobManager and two TaskManagers, each a process of its own; stopped when
    tests/streaming is done."""
    cluster = StandaloneCluster(ClusterSettings(root=tmp_path_factory.mktemp("flink_cluster")))
    try:
        yield cluster.start(timeout=TIMEOUT)
    finally:
        cluster.stop()


@pytest.fixture(scope="package")  # the live job stops with tests/streaming, not at the end of the suite
def streaming_run(pipeline_dir, stream_days, tmp_path_factory) -> StreamingRun:
    root = tmp_path_factory.mktemp("streaming")
    repo = root / "feature_repo"
    shutil.copytree(pipeline_dir / "feature_repo", repo)  # batch features already online; not shared state
    engine = FeatureStoreEngine(FeatureStoreSettings(repo_dir=repo, offline_root=pipeline_dir / "offline"))
    events_dir = root / "events"
    stream = EventStream(stream_days.simulator, events_dir)
    job = FlinkJob(
        StreamingJobSettings(
            "interactions",
            root / "job",
            SourceOptions(path=str(events_dir), monitor_seconds=0.5),
            slide_seconds=SLIDE,
            watermark_delay_seconds=WATERMARK_DELAY,
            checkpoint_interval_ms=1000,
            live_rows=True,
            jvm_options=SHORT_LIVED_JVM_OPTIONS,  # a run of a minute or two: it starts sooner
        )
    )
    pusher = OnlinePusher(engine.store, job.spec(), live_keep_seconds=3600)  # the tests read every live row
    day, tail = stream_days.day, stream_days.tail
    next_day = STREAM_DAY + timedelta(days=1)
    first_half = before(day, datetime.combine(STREAM_DAY, day_time(12), tzinfo=UTC))
    second_half = day.slice(first_half.num_rows)
    try:
        job.start()
        job.wait_running(TIMEOUT)
        appended = append_in_chunks(stream, job, first_half, chunks=8)
        # crash the job once a checkpoint holds everything appended so far
        pusher.poll()
        os.killpg(job.status()["pid"], signal.SIGKILL)
        health_after_kill = wait_until(lambda: (h := job.health()).status == "DIED" and h, "the kill to be noticed")

        _, checkpoint = job.restart()
        job.wait_running(TIMEOUT)
        appended += append_in_chunks(stream, job, second_half, chunks=8)
        appended += append_in_chunks(stream, job, tail, chunks=3)
        late = day.slice(day.num_rows // 4, 20)  # new events from the morning, hours behind the watermark now
        late = late.set_column(0, "event_id", pa.array([f"late-{k}" for k in range(late.num_rows)]))
        stream.append(late)
        malformed = malformed_lines(day)
        stream.append_lines(malformed)
        lines = appended + late.num_rows + len(malformed)
        wait_for_records(job, lines, "every line to be read and checkpointed", pusher=pusher)
        end_of_day = datetime.combine(next_day, day_time(), tzinfo=UTC)
        wait_until(
            lambda: newest_window_end(job.sink_root / "item_trending") >= end_of_day.strftime("%Y-%m-%d %H:%M:%S"),
            "the windows ending at midnight",
            pusher=pusher,
        )
        time.sleep(3)  # one more checkpoint, then apply whatever it committed
        pusher.poll()
        yield StreamingRun(
            job=job,
            engine=engine,
            pusher=pusher,
            streamed=pa.concat_tables([day, tail]),
            lines_appended=lines,
            late_events=late.num_rows,
            malformed_events=len(malformed),
            health_after_kill=health_after_kill,
            checkpoint_restored=checkpoint,
            health_at_end=job.health(),
        )
    finally:
        job.stop()
        pusher.close()
