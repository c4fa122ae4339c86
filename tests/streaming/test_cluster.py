"""The production path on a real Flink session cluster (a JobManager and two TaskManagers, each a
process of its own, started from the wheel's bin/): the job body submits the compiled job with
remote execution and the platform watches it through the JobManager's REST API. The TaskManager
running the job is killed mid-stream; Flink restarts the job on the other one from its checkpoint,
and every window still equals the polars plan, every line counted once. Event times arrive as
different producers write them (UTC offsets, no fractional seconds)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from datetime import time as day_time

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engines.streaming import (
    ClusterJob,
    FlinkJob,
    JobHealth,
    SourceOptions,
    StandaloneCluster,
    StreamingJobSettings,
)
from engines.streaming.backlog import resume
from engines.streaming.job import SHORT_LIVED_JVM_OPTIONS
from feature_defs import catalogue
from simulator.stream import EventStream
from tests.streaming.conftest import (
    SLIDE,
    STREAM_DAY,
    TIMEOUT,
    WATERMARK_DELAY,
    append_in_chunks,
    assert_windows_equal_polars,
    before,
    newest_window_end,
    sink_frame,
    varied_time_lines,
    wait_until,
    with_whole_seconds,
)

STREAMING_VIEWS = [v for v in catalogue.views if v.streaming]


@dataclass
class ClusterRun:
    job: ClusterJob
    streamed: pa.Table  # every event appended, at the instants its lines name
    lines: int
    killed: str  # the TaskManager that ran the job
    running_after: set[str]  # the TaskManagers running it after the restart
    health: JobHealth  # after the lost TaskManager
    backlog_files: int  # landed while the job was stopped
    health_at_end: JobHealth  # after the downtime and the resume


@pytest.fixture(scope="module")
def cluster_run(flink_cluster: StandaloneCluster, stream_days, tmp_path_factory) -> ClusterRun:
    root = tmp_path_factory.mktemp("cluster_job")
    stream = EventStream(stream_days.simulator, root / "events")
    job = ClusterJob(
        StreamingJobSettings(
            "interactions",
            root / "job",
            SourceOptions(path=str(root / "events"), monitor_seconds=0.5),
            slide_seconds=SLIDE,
            watermark_delay_seconds=WATERMARK_DELAY,
            checkpoint_interval_ms=1000,
            state_backend="rocksdb",  # as the prod profile runs it
            rest=flink_cluster.rest_address,
        )
    )
    events = with_whole_seconds(before(stream_days.day, at(18)))
    morning, afternoon, evening, night = (between(events, a, b) for a, b in ((0, 8), (8, 16), (16, 17), (17, 18)))
    try:
        job_id = job.submit()
        job.wait_running(TIMEOUT)
        lines = append_in_chunks(stream, job, morning, chunks=4, render=varied_time_lines)
        [killed] = flink_cluster.rest.job_taskmanagers(job_id)
        flink_cluster.kill_taskmanager(killed)  # the counts above are committed: a checkpoint holds them
        wait_until(lambda: job.health().restarts >= 1, "Flink to restart the job")
        job.wait_running(TIMEOUT)
        # the REST API answers from an execution graph it caches (rest.cache.execution-graph.*): for a
        # moment after the restart it still names the lost TaskManager (seen in a CI rehearsal)
        running_after = wait_until(
            lambda: (tms := flink_cluster.rest.job_taskmanagers(job_id)) and killed not in tms and tms,
            "the job to run on the TaskManager left",
        )
        lines += append_in_chunks(stream, job, afternoon, chunks=4, render=varied_time_lines)
        wait_until(lambda: newest_window(job) >= f"{STREAM_DAY} 15:30:00", "the windows of the afternoon")
        health = job.health()

        job.stop()  # downtime: an hour of events lands in a dozen files, then the job resumes
        size = -(-evening.num_rows // 12)
        for start in range(0, evening.num_rows, size):
            stream.append_lines(varied_time_lines(evening.slice(start, size)))
        resume(job, TIMEOUT)
        lines += evening.num_rows + append_in_chunks(stream, job, night, chunks=2, render=varied_time_lines)
        wait_until(lambda: newest_window(job) >= f"{STREAM_DAY} 17:30:00", "the windows after the downtime")
        yield ClusterRun(
            job=job,
            streamed=events,
            lines=lines,
            killed=killed,
            running_after=running_after,
            health=health,
            backlog_files=-(-evening.num_rows // size),
            health_at_end=job.health(),
        )
    finally:
        job.stop()


def at(hour: int) -> datetime:
    return datetime.combine(STREAM_DAY, day_time(hour), tzinfo=UTC)


def between(table: pa.Table, first: int, last: int) -> pa.Table:
    times = table["event_timestamp"]
    return table.filter(
        pc.and_(
            pc.greater_equal(times, pa.scalar(at(first), times.type)), pc.less(times, pa.scalar(at(last), times.type))
        )
    )


def newest_window(job: ClusterJob, view: str = "item_trending") -> str:
    return newest_window_end(job.sink_root / view)


def test_the_job_runs_on_the_cluster_and_survives_a_lost_taskmanager(cluster_run, flink_cluster):
    health = cluster_run.health
    assert health.status == "RUNNING" and health.healthy and health.restarts >= 1
    assert cluster_run.killed not in cluster_run.running_after and cluster_run.running_after
    assert health.checkpoint and "/chk-" in health.checkpoint
    assert flink_cluster.rest.overview()["taskmanagers"] == 1
    assert health.malformed == 0  # whatever the form of its time
    config = flink_cluster.rest.get(f"/jobs/{cluster_run.job.status()['job_id']}/checkpoints/config")
    assert "RocksDB" in config["state_backend"], config  # restored from RocksDB's checkpoint, with the changelog


def test_a_backlog_after_downtime_is_caught_up_without_a_late_event(cluster_run):
    health = cluster_run.health_at_end
    assert cluster_run.backlog_files == 12 and health.status == "RUNNING" and health.healthy
    # every line counted exactly once across the lost TaskManager and the downtime; none late
    assert (health.records, health.malformed, health.late) == (cluster_run.lines, 0, 0)


@pytest.mark.parametrize("view", STREAMING_VIEWS, ids=lambda v: v.name)
def test_every_window_equals_the_polars_plan_through_the_lost_taskmanager(cluster_run, view):
    sink = sink_frame(cluster_run.job.sink_root / view.name)
    # duplicates would show a re-emitted window; counts off, events lost or read twice; a time
    # parsed to another instant, events in the wrong window
    assert assert_windows_equal_polars(sink, pl.from_arrow(cluster_run.streamed), view) > 300


def test_the_submitting_client_runs_as_a_short_lived_jvm_and_a_local_job_as_its_settings_say(tmp_path):
    """The job body's JVM only plans and submits a cluster job; a local one runs the job itself."""
    settings = StreamingJobSettings("interactions", tmp_path / "job", SourceOptions(path=str(tmp_path)), rest="h:8081")
    assert ClusterJob(settings).env()["JVM_ARGS"].split() == ["-Xmx2g", *SHORT_LIVED_JVM_OPTIONS.split()]
    assert ClusterJob(settings, mode="batch").env()["JVM_ARGS"].split() == ["-Xmx2g", *SHORT_LIVED_JVM_OPTIONS.split()]
    local = replace(settings, rest="")
    assert FlinkJob(local).env()["JVM_ARGS"] == "-Xmx2g"  # a long-running job keeps the optimizing compiler
    short = replace(local, jvm_options=SHORT_LIVED_JVM_OPTIONS, jvm_heap="1g")
    assert FlinkJob(short).env()["JVM_ARGS"].split() == ["-Xmx1g", *SHORT_LIVED_JVM_OPTIONS.split()]
