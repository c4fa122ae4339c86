"""The one Definitions object of mlplane. It assembles; the domains compute.

Nothing is listed by hand: the assets, checks and pipelines of every module in assets/, every job in
jobs/, every schedule and sensor in the orchestration modules below are loaded."""

from types import ModuleType

from dagster import (
    Definitions,
    JobDefinition,
    ScheduleDefinition,
    SensorDefinition,
    in_process_executor,
)

import jobs
from assets import all_asset_checks, all_assets, pipeline_jobs, pipeline_schedules
from orchestration import schedules, sensors, streaming
from orchestration.dagster_internals import UnresolvedAssetJobDefinition, UnresolvedPartitionedAssetScheduleDefinition
from orchestration.profiles import current_profile, resources_for, warn_about_unset_notifications


def defined_in(modules: list[ModuleType], types: tuple[type, ...]) -> list:
    """Module-level objects of `types` (single or in lists), one per name."""
    found = {}
    for module in modules:
        for value in vars(module).values():
            for item in value if type(value) in (list, tuple) else [value]:
                if isinstance(item, types):
                    found.setdefault(item.name, item)
    return list(found.values())


warn_about_unset_notifications(current_profile())
defs = Definitions(
    assets=all_assets,
    asset_checks=all_asset_checks,
    jobs=[*defined_in([jobs], (JobDefinition, UnresolvedAssetJobDefinition)), *pipeline_jobs],
    schedules=[
        *defined_in([schedules], (ScheduleDefinition, UnresolvedPartitionedAssetScheduleDefinition)),
        *pipeline_schedules,
    ],
    sensors=defined_in([sensors, streaming], (SensorDefinition,)),
    resources=resources_for(current_profile()),
    # One process per run: on small machines the per-step process start (Feast, GX imports) costs
    # more than it saves, and GX's project file must not be written by two steps at once.
    executor=in_process_executor,
)
