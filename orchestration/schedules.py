from datetime import timedelta

from dagster import RunRequest, ScheduleEvaluationContext, build_schedule_from_partitioned_job, schedule

from assets.models import train_personalization
from jobs import batch_inference, daily_pipeline, training_data

# Yesterday's partition, early morning UTC, after upstream systems have delivered the day.
daily_pipeline_schedule = build_schedule_from_partitioned_job(daily_pipeline, hour_of_day=2, minute_of_hour=15)

# Models retrain on the newest day once the daily pipeline has built it.
training_schedules = [train_personalization.schedule,
                      build_schedule_from_partitioned_job(batch_inference, hour_of_day=5)]


@schedule(job=training_data, cron_schedule="45 3 * * *", execution_timezone="UTC",
          description="The training data of the day before yesterday: its labels need yesterday's first "
                      "minutes, which the daily pipeline ingested this morning.")
def training_data_schedule(context: ScheduleEvaluationContext) -> RunRequest:
    day = context.scheduled_execution_time.date() - timedelta(days=2)
    return RunRequest(run_key=day.isoformat(), partition_key=day.isoformat())
