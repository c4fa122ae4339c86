"""Schedules of the jobs in jobs/ (every schedule here is loaded; pipelines bring their own)."""

from dagster import build_schedule_from_partitioned_job

from jobs import batch_inference, daily_pipeline, ground_truth_queues

# Yesterday's partition, early morning UTC, after upstream systems have delivered the day.
daily_pipeline_schedule = build_schedule_from_partitioned_job(daily_pipeline, hour_of_day=2, minute_of_hour=15)

# Batch inference scores the newest day with the champion the 04:00 training run may have promoted.
batch_inference_schedule = build_schedule_from_partitioned_job(batch_inference, hour_of_day=5)

# The labeling queues fill once the day's flags, reports and models exist.
ground_truth_schedule = build_schedule_from_partitioned_job(ground_truth_queues, hour_of_day=6)
