"""Schedules of the jobs in jobs/ (every schedule here is loaded; pipelines bring their own)."""

from datetime import timedelta

from dagster import RunRequest, ScheduleEvaluationContext, build_schedule_from_partitioned_job, schedule

from jobs import (
    batch_inference,
    daily_pipeline,
    ground_truth_queues,
    llm_batch_daily,
    online_monitoring,
    training_data,
)

# Yesterday's partition, early morning UTC, after upstream systems have delivered the day.
daily_pipeline_schedule = build_schedule_from_partitioned_job(daily_pipeline, hour_of_day=2, minute_of_hour=15)

# Batch inference scores the newest day with the champion the 04:00 training run may have promoted.
batch_inference_schedule = build_schedule_from_partitioned_job(batch_inference, hour_of_day=5)

# Batch LLM inference over yesterday's items, once they are ingested (the gateway must be up).
llm_batch_schedule = build_schedule_from_partitioned_job(llm_batch_daily, hour_of_day=3, minute_of_hour=15)

# The labeling queues fill once the day's flags, reports and models exist.
ground_truth_schedule = build_schedule_from_partitioned_job(ground_truth_queues, hour_of_day=6)


def day_before_yesterday(job, cron: str, description: str):
    """`<job>_schedule`: the partition of the day before yesterday, for a day whose results need the
    next day's first hour, which the daily pipeline (02:15) ingested this morning."""

    @schedule(
        name=f"{job.name}_schedule", job=job, cron_schedule=cron, execution_timezone="UTC", description=description
    )
    def _day_before_yesterday(context: ScheduleEvaluationContext) -> RunRequest:
        day = context.scheduled_execution_time.date() - timedelta(days=2)
        return RunRequest(run_key=day.isoformat(), partition_key=day.isoformat())

    return _day_before_yesterday


training_data_schedule = day_before_yesterday(
    training_data,
    "45 3 * * *",
    "The training data of the day before yesterday: its labels need yesterday's first "
    "minutes, which the daily pipeline ingested this morning.",
)

online_monitoring_schedule = day_before_yesterday(
    online_monitoring,
    "30 3 * * *",
    "Online accuracy of the day before yesterday: the outcomes of its last answers come in "
    "yesterday's first hour, which the daily pipeline ingested this morning.",
)
