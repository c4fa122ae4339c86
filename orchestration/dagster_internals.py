"""Dagster's private API, in one place: every name mlplane takes from a `dagster._...` module, so a Dagster
upgrade is checked here and nowhere else (tests/test_private_apis.py keeps every other module off them).

Each name is imported when first asked for (PEP 562), so importing this module costs nothing: some of
them (the workspace, the CLIs) take most of a second to import and only a few commands need them."""

import importlib

# name here -> (private module, name there)
_PRIVATE = {
    # partitioned runs: the tags a backfill's single run carries (not exported by `dagster`)
    "ASSET_PARTITION_RANGE_START_TAG": ("dagster._core.storage.tags", "ASSET_PARTITION_RANGE_START_TAG"),
    "ASSET_PARTITION_RANGE_END_TAG": ("dagster._core.storage.tags", "ASSET_PARTITION_RANGE_END_TAG"),
    # what `define_asset_job` and `build_schedule_from_partitioned_job` return before Definitions resolves them
    "UnresolvedAssetJobDefinition": (
        "dagster._core.definitions.unresolved_asset_job_definition",
        "UnresolvedAssetJobDefinition",
    ),
    "UnresolvedPartitionedAssetScheduleDefinition": (
        "dagster._core.definitions.partitions.partitioned_schedule",
        "UnresolvedPartitionedAssetScheduleDefinition",
    ),
    # a sensor's stored state, set the way the daemon reads it (orchestration/home.py)
    "InProcessCodeLocationOrigin": ("dagster._core.remote_origin", "InProcessCodeLocationOrigin"),
    "InProcessCodeLocation": ("dagster._core.remote_representation.code_location", "InProcessCodeLocation"),
    "LoadableTargetOrigin": ("dagster._core.types.loadable_target_origin", "LoadableTargetOrigin"),
    "InstigatorState": ("dagster._core.scheduler.instigation", "InstigatorState"),
    "InstigatorStatus": ("dagster._core.scheduler.instigation", "InstigatorStatus"),
    "InstigatorType": ("dagster._core.scheduler.instigation", "InstigatorType"),
    "SensorInstigatorData": ("dagster._core.scheduler.instigation", "SensorInstigatorData"),
    # the daemon's ticks, read so that a failing sensor or schedule reaches the notification targets
    "TickStatus": ("dagster._core.scheduler.instigation", "TickStatus"),
    "SerializableErrorInfo": ("dagster._utils.error", "SerializableErrorInfo"),
    # the instance's logging setup, patched so runs on threads do not deadlock (orchestration/lanes.py)
    "EventMethods": ("dagster._core.instance.methods.event_methods", "EventMethods"),
    # instance settings: a compute log manager chosen per run, dagster.yaml read as the instance reads it
    "ConfigurableClassData": ("dagster._serdes", "ConfigurableClassData"),
    "dagster_instance_config": ("dagster._core.instance.config", "dagster_instance_config"),
    # the run coordinator's tag limits, checked against our pools in tests
    "TagConcurrencyLimitsCounter": ("dagster._utils.tags", "TagConcurrencyLimitsCounter"),
    # the webserver's routes and the console scripts the images install, read by the deployment tests
    "WorkspaceProcessContext": ("dagster._core.workspace.context", "WorkspaceProcessContext"),
    "EmptyWorkspaceTarget": ("dagster._core.workspace.load_target", "EmptyWorkspaceTarget"),
    "WorkspaceFileTarget": ("dagster._core.workspace.load_target", "WorkspaceFileTarget"),
    "dagster_cli": ("dagster._cli", "cli"),
    "dagster_daemon_cli": ("dagster._daemon.cli", "cli"),
    # one daemon tick of the sensors and the schedules, run by the notification tests
    "InProcessWorkspaceLoadTarget": ("dagster._core.workspace.load_target", "InProcessWorkspaceLoadTarget"),
    "create_test_daemon_workspace_context": ("dagster._core.test_utils", "create_test_daemon_workspace_context"),
    "freeze_time": ("dagster._core.test_utils", "freeze_time"),
    "execute_sensor_iteration": ("dagster._daemon.sensor", "execute_sensor_iteration"),
    "DaemonHeartbeat": ("dagster._daemon.types", "DaemonHeartbeat"),
    "launch_scheduled_runs": ("dagster._scheduler.scheduler", "launch_scheduled_runs"),
}

# A compute log manager that captures nothing, by module and class as dagster.yaml names them.
NO_CAPTURE_LOG_MANAGER = ("dagster._core.storage.noop_compute_log_manager", "NoOpComputeLogManager")

__all__ = [*_PRIVATE, "NO_CAPTURE_LOG_MANAGER"]


def __getattr__(name: str):
    if name not in _PRIVATE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _PRIVATE[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value
