"""Resuming a job after downtime. The events that landed meanwhile (the backlog) are read by
Flink's file source in no particular order: with the usual watermark, the first newer file read
would push the watermark past the older ones, which would then be dropped as late. So a resume
first runs the job with the watermark held back over the backlog's span of event time (the windows
come out later, with the same values), until a checkpoint holds the whole backlog, then restarts
it from that checkpoint with the usual delay, which keeps results fresh again."""

from __future__ import annotations

import json
import math
import os
import time
from datetime import datetime
from pathlib import Path

from engines.streaming.job import FlinkJob, StreamingJobError, parse_time


def newest_waiting(job: FlinkJob) -> datetime | None:
    """The newest event time in the source folder's newest file (files land in arrival order)."""
    options = job.settings.source_options
    if options.kind != "files":
        return None  # Kafka: the source reads partitions in offset order
    try:
        files = [entry for entry in os.scandir(options.path) if entry.is_file() and not entry.name.startswith(".")]
    except FileNotFoundError:
        return None
    if not files:
        return None
    column = next(s.timestamp_field for s in job.catalogue.sources if s.name == job.settings.source)
    times = []
    for line in Path(max(files, key=lambda e: e.stat().st_mtime).path).read_text().splitlines():
        try:
            times.append(parse_time(json.loads(line)[column]))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # malformed: the job counts it
    return max(times, default=None)


def backlog_seconds(job: FlinkJob) -> int:
    """Event time between the newest event the job has processed and the newest one waiting."""
    processed, waiting = job.metrics()["newest_event_time"], newest_waiting(job)
    if not (processed and waiting):
        return 0
    return max(0, math.ceil((waiting - parse_time(processed)).total_seconds()))


def catch_up(job: FlinkJob, timeout: float = 600.0) -> Path | None:
    """With `job` stopped: run it over its backlog with the watermark held back, if it has one,
    until a checkpoint holds it all. Returns the checkpoint to resume from (the newest)."""
    checkpoint = job.latest_checkpoint()
    behind = backlog_seconds(job) if checkpoint else 0
    if behind <= job.settings.watermark_delay_seconds:
        return checkpoint
    waiting = newest_waiting(job)
    waiting = waiting.replace(microsecond=waiting.microsecond // 1000 * 1000)  # Flink keeps milliseconds
    job.watermark_hold_seconds = behind
    try:
        job.start(restore=checkpoint)
        job.wait_running(timeout)
        _wait_for(lambda: parse_time(job.metrics()["newest_event_time"]) >= waiting, timeout, job)
        job.stop()
    finally:
        job.watermark_hold_seconds = 0
    return job.latest_checkpoint()


def resume(job: FlinkJob, timeout: float = 600.0) -> Path | None:
    """Start `job` again from its newest checkpoint, catching up a backlog first (see above).
    Returns the checkpoint the job resumed from."""
    job.stop()
    checkpoint = catch_up(job, timeout)
    job.start(restore=checkpoint)
    job.wait_running(timeout)
    return checkpoint


def _wait_for(condition, timeout: float, job: FlinkJob) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():  # the job's counts are committed at checkpoints: one holds the backlog
            return
        time.sleep(0.5)
    raise StreamingJobError(f"{job.settings.name} did not catch up its backlog in {timeout:.0f}s (log: {job.log_dir})")
