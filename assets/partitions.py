from datetime import date

from dagster import DailyPartitionsDefinition

# The marketplace's history starts here. A constant, not a setting: the partition set is part of the
# asset graph's definition (environment variables are read only in orchestration/profiles.py).
START_DATE = "2026-01-01"

daily_partitions = DailyPartitionsDefinition(start_date=START_DATE, timezone="UTC")
# What the online model server logs accrues during the day: its partition of today exists (Dagster's
# end_offset), so a running A/B test's logs and accuracy can be taken in before midnight and re-run after.
serving_partitions = DailyPartitionsDefinition(start_date=START_DATE, timezone="UTC", end_offset=1)


def partition_days(context) -> list[date]:
    """The days a run covers: one partition, or a range under a single-run backfill policy."""
    return [date.fromisoformat(k) for k in context.partition_keys]
