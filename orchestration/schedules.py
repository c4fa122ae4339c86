from dagster import build_schedule_from_partitioned_job

from assets.models import train_personalization
from jobs import batch_inference, daily_pipeline, ground_truth_queues

# Yesterday's partition, early morning UTC, after upstream systems have delivered the day.
daily_pipeline_schedule = build_schedule_from_partitioned_job(daily_pipeline, hour_of_day=2, minute_of_hour=15)

# Models retrain on the newest day once the daily pipeline has built it.
training_schedules = [train_personalization.schedule,
                      build_schedule_from_partitioned_job(batch_inference, hour_of_day=5)]

# The labeling queues fill once the day's flags, reports and models exist.
ground_truth_schedule = build_schedule_from_partitioned_job(ground_truth_queues, hour_of_day=6)
