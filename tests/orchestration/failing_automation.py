"""A code location for the automation-failure tests: a sensor and a schedule that raise while the file
MLPLANE_TEST_BREAK names exists, beside the platform's automation_failure_sensor and the notifier the
profiles build from the environment."""

import os
from pathlib import Path

from dagster import (
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    SkipReason,
    job,
    op,
    schedule,
    sensor,
)

from assets.pipelines import NOTIFY_TAG
from orchestration.profiles import notifier
from orchestration.sensors import automation_failure_sensor


def broken() -> bool:
    return Path(os.environ["MLPLANE_TEST_BREAK"]).exists()


@op
def nothing() -> None:
    pass


@job(tags={NOTIFY_TAG: "ml-oncall"})
def oncall_job() -> None:
    nothing()


@sensor(job=oncall_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING)
def flaky_sensor(context):
    if broken():
        raise RuntimeError("the landing folder is unreachable")
    return SkipReason("nothing landed")


@schedule(job=oncall_job, cron_schedule="* * * * *", default_status=DefaultScheduleStatus.RUNNING)
def flaky_schedule(context):
    if broken():
        raise RuntimeError("the calendar service is down")
    return SkipReason("no run this minute")


defs = Definitions(
    jobs=[oncall_job],
    sensors=[flaky_sensor, automation_failure_sensor],
    schedules=[flaky_schedule],
    resources={"notifier": notifier()},
)
