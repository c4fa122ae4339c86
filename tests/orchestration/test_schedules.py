"""The schedules of days whose results need the next day: each asks for the day before yesterday."""

from datetime import UTC, datetime

import pytest
from dagster import build_schedule_context

from orchestration.schedules import online_monitoring_schedule, training_data_schedule


@pytest.mark.parametrize("schedule", [training_data_schedule, online_monitoring_schedule], ids=lambda s: s.name)
def test_a_tick_runs_the_day_before_yesterday(schedule):
    request = schedule(build_schedule_context(scheduled_execution_time=datetime(2026, 3, 1, 3, 30, tzinfo=UTC)))
    assert (request.partition_key, request.run_key) == ("2026-02-27", "2026-02-27")
