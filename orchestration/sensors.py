"""Sensors: a run when a day lands (or changes) in landing, an export when a served model's registry version
changes, a re-embedding of the catalogue when the champion CLIP changes, a notification when a run
fails, and one when a sensor, schedule or Dagster daemon starts failing (and when it recovers)."""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, dataclass
from datetime import date

from dagster import (
    DagsterInstance,
    DagsterInvalidDefinitionError,
    DefaultSensorStatus,
    RepositoryDefinition,
    RunFailureSensorContext,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    SupersessionWarning,
    build_sensor_for_freshness_checks,
    run_failure_sensor,
    sensor,
)

from assets import all_asset_checks
from assets.model_export import served_versions
from assets.partitions import daily_partitions
from assets.pipelines import NOTIFY_TAG
from engines.data.lake import Lake
from engines.retrieval import clip_registry
from engines.retrieval.embeddings import EMBEDDINGS_ZONE, ITEMS_TABLE, days_of_other_versions
from feature_defs.sources import all_sources
from jobs import clip_reembed, daily_pipeline, model_export
from orchestration.dagster_internals import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    SerializableErrorInfo,
    TickStatus,
)
from resources.lake import LakeResource
from resources.model_server import ModelServerResource
from resources.notifications import WebhookNotifier
from resources.registry import ModelRegistryResource


def landing_fingerprints(lake: Lake) -> dict[str, str]:
    """Per day on which every stream has landed: a hash of the day's files (name, size, mtime)."""
    days: set[date] | None = None
    for source in all_sources:
        landed = set(lake.landing_days(source.name))
        days = landed if days is None else days & landed
    fingerprints = {}
    for day in sorted(days or ()):
        per_stream = {s.name: lake.landing_files(s.name, day) for s in all_sources}
        if all(per_stream.values()):  # a day folder may exist before its files do
            files = [(s, p.name, p.stat().st_size, p.stat().st_mtime_ns) for s, ps in per_stream.items() for p in ps]
            fingerprints[day.isoformat()] = hashlib.sha256(repr(files).encode()).hexdigest()[:16]
    return fingerprints


def landing_cursor(lake: Lake, days: list[date]) -> str:
    """The landing sensor's cursor once `days` have been run from their current landing files (the demo
    stores it, so the UI's sensor does not run them again)."""
    wanted = {d.isoformat() for d in days}
    return json.dumps({d: fp for d, fp in landing_fingerprints(lake).items() if d in wanted}, sort_keys=True)


@sensor(
    job=daily_pipeline,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Runs the daily pipeline once every stream of a day has landed. Late or corrected files for "
    "an earlier day re-run that day and every later landed day, whose windows include it.",
)
def landing_sensor(context: SensorEvaluationContext, lake: LakeResource):
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    valid_keys = set(daily_partitions.get_partition_keys())
    current = {day: fp for day, fp in landing_fingerprints(lake.get_client()).items() if day in valid_keys}
    changed = sorted(day for day, fp in current.items() if seen.get(day) != fp)
    if not changed:
        return SkipReason("no new or changed landing files")
    start, end = changed[0], max(current)
    run_key = f"{start}..{end}:" + hashlib.sha256("".join(current[d] for d in changed).encode()).hexdigest()[:16]
    if start == end:
        request = RunRequest(run_key=run_key, partition_key=start)
    else:  # one run over the range: the daily assets have single-run backfill policies
        request = RunRequest(
            run_key=run_key, tags={ASSET_PARTITION_RANGE_START_TAG: start, ASSET_PARTITION_RANGE_END_TAG: end}
        )
    return SensorResult(run_requests=[request], cursor=json.dumps({**seen, **current}, sort_keys=True))


@run_failure_sensor(
    default_status=DefaultSensorStatus.RUNNING,
    description="Posts every failed run to the webhook in the notifier resource (MLPLANE_WEBHOOK_URL).",
)
def notify_run_failure(context: RunFailureSensorContext, notifier: WebhookNotifier):
    run = context.dagster_run
    payload = {
        "text": f"mlplane run {run.run_id[:8]} of {run.job_name} failed: {context.failure_event.message}",
        "run_id": run.run_id,
        "job": run.job_name,
        "partition": run.tags.get("dagster/partition"),
        "error": context.failure_event.message,
    }
    targets = [t for t in run.tags.get(NOTIFY_TAG, "").split(",") if t]
    posted, unknown = notifier.post_to_targets(targets, payload)
    if notifier.url and notifier.post(payload):
        posted.append(notifier.url)
    if unknown:
        context.log.warning(
            f"run {run.run_id}: no webhook for notification targets {unknown} (set MLPLANE_NOTIFY_<TARGET>)"
        )
    if posted:
        context.log.info(f"notified {', '.join(posted)} of failed run {run.run_id}")
    else:
        context.log.warning(f"run {run.run_id} failed; no webhook configured (set MLPLANE_WEBHOOK_URL)")


# evaluates the time-partition freshness checks (why they stay: assets/__init__.py)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", SupersessionWarning)
    freshness_sensor = build_sensor_for_freshness_checks(
        freshness_checks=all_asset_checks, minimum_interval_seconds=600, default_status=DefaultSensorStatus.RUNNING
    )


@sensor(
    job=model_export,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Exports the served models for KServe and Triton (deploy/model_export) when the registry version "
    "a served model follows changes: a promotion, a rollback (`mlplane models rollback`), a new CLIP.",
)
def model_export_sensor(
    context: SensorEvaluationContext,
    lake: LakeResource,
    model_registry: ModelRegistryResource,
    model_server: ModelServerResource,
):
    if not model_server.url:
        return SkipReason("no model server to export for: MLPLANE_MODEL_SERVER_URL is not set")
    versions = served_versions(model_server.config_path, lake.get_client().root, model_registry.get_client())
    if not versions:
        return SkipReason("no served model has a registry version yet")
    cursor = json.dumps(versions, sort_keys=True)
    if cursor == context.cursor:
        return SkipReason("the served versions are the ones last exported")
    # no run key: a rollback returns to versions exported before, and must be exported again
    return SensorResult(run_requests=[RunRequest(tags={"mlplane/served_versions": cursor})], cursor=cursor)


@sensor(
    job=clip_reembed,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Re-embeds the catalogue when the registry's champion CLIP changes (a better version trained by "
    "clip_model, `mlplane models promote` or `rollback` of `clip`): one run over every embedded day, whenever a "
    "day's embeddings are of another version than the champion.",
)
def clip_champion_sensor(context: SensorEvaluationContext, lake: LakeResource, model_registry: ModelRegistryResource):
    store, registry = lake.get_client(), model_registry.get_client()
    try:
        version, registry_version = clip_registry.champion_version(registry, clip_registry.cache_folder(store.root))
    except LookupError as error:
        return SkipReason(str(error))
    stale = days_of_other_versions(store, version)
    if not stale:
        return SkipReason(f"every embedded day is of the champion CLIP {version}")
    days = store.partition_days(EMBEDDINGS_ZONE, ITEMS_TABLE)
    # one run per champion change: a rollback to a version embedded before is a change of its own
    changes = len(registry.alias_log(clip_registry.MODEL_NAME, clip_registry.CHAMPION))
    context.log.info(f"{len(stale)} embedded day(s) not of the champion {version}: re-embedding {days[0]}..{days[-1]}")
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"clip-v{registry_version}-change{changes}",
                tags={
                    ASSET_PARTITION_RANGE_START_TAG: days[0].isoformat(),
                    ASSET_PARTITION_RANGE_END_TAG: days[-1].isoformat(),
                    "mlplane/clip_version": version,
                },
            )
        ]
    )


# --- failures of the automation itself: sensors, schedules and daemons ---------------------------------
@dataclass(frozen=True)
class Failure:
    kind: str  # sensor, schedule or daemon
    name: str
    error: str  # the first line of the newest error


def failing_instigators(instance: DagsterInstance, besides: str) -> dict[str, Failure]:
    """Each running sensor and schedule (but `besides`) whose newest tick failed, and each daemon whose
    newest heartbeat carries errors; keyed by kind:name."""
    failures = {}
    for state in instance.all_instigator_state():
        if not state.is_running or state.name == besides:
            continue
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
        if ticks and ticks[0].status == TickStatus.FAILURE:
            kind = state.instigator_type.value.lower()
            failures[f"{kind}:{state.name}"] = Failure(kind, state.name, first_line(ticks[0].error))
    for daemon, heartbeat in instance.get_daemon_heartbeats().items():
        if heartbeat.errors:
            failures[f"daemon:{daemon}"] = Failure("daemon", daemon, first_line(heartbeat.errors[0]))
    return failures


def first_line(error: SerializableErrorInfo | None) -> str:
    """The first line of the error's root cause (a sensor's own exception, not Dagster's wrapper)."""
    if error is None:
        return "no error recorded"
    while error.cause is not None:
        error = error.cause
    return (error.message.strip().splitlines() or [error.cls_name or "error"])[0]


def notify_targets_of(repository: RepositoryDefinition | None, failure: Failure) -> list[str]:
    """The notify= targets of the job a failing sensor or schedule starts (none for a daemon)."""
    try:
        if failure.kind == "sensor" and repository and repository.has_sensor_def(failure.name):
            job_name = repository.get_sensor_def(failure.name).job_name
        elif failure.kind == "schedule" and repository and repository.has_schedule_def(failure.name):
            job_name = repository.get_schedule_def(failure.name).job_name
        else:
            return []
    except DagsterInvalidDefinitionError:  # a sensor of several jobs, or of none
        return []
    if not job_name or not repository.has_job(job_name):
        return []
    return [t for t in repository.get_job(job_name).tags.get(NOTIFY_TAG, "").split(",") if t]


def failure_payload(failure: Failure, recovered: bool) -> dict:
    what = "Dagster daemon" if failure.kind == "daemon" else failure.kind
    if recovered:
        text = f"mlplane {what} {failure.name} has recovered"
    else:
        text = f"mlplane {what} {failure.name} is failing: {failure.error} (reported once until it recovers)"
    status = "recovered" if recovered else "failing"
    return {"text": text, "kind": failure.kind, "name": failure.name, "status": status, "error": failure.error}


@sensor(
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Posts a sensor or schedule whose ticks fail, and a Dagster daemon that reports errors, to the "
    "webhook in the notifier resource (MLPLANE_WEBHOOK_URL) and the notify= targets of the job it starts: once "
    "when it starts failing and once when it recovers, not on every tick.",
)
def automation_failure_sensor(context: SensorEvaluationContext, notifier: WebhookNotifier):
    reported = {key: Failure(**value) for key, value in json.loads(context.cursor or "{}").items()}
    failing = failing_instigators(context.instance, besides=context.sensor_name)
    changes = [(f, False) for key, f in failing.items() if key not in reported]
    changes += [(f, True) for key, f in reported.items() if key not in failing]
    if not changes:
        return SkipReason(f"{len(failing)} failing, each already reported" if failing else "nothing is failing")
    for failure, recovered in changes:
        key = f"{failure.kind}:{failure.name}"
        payload = failure_payload(failure, recovered)
        delivery = notifier.deliver(payload, notify_targets_of(context.repository_def, failure))
        if delivery.failed:  # reported again on the next tick
            context.log.warning(f"{payload['text']}: webhook(s) {delivery.failed} refused it; retrying next tick")
            continue
        if not delivery.posted:
            context.log.warning(payload["text"] + " (no webhook configured: set MLPLANE_WEBHOOK_URL)")
        if delivery.unknown:
            context.log.warning(f"no webhook for notification targets {delivery.unknown} (set MLPLANE_NOTIFY_<TARGET>)")
        if recovered:
            reported.pop(key)
        else:
            reported[key] = failure
    cursor = {key: asdict(failure) for key, failure in sorted(reported.items())}
    return SensorResult(cursor=json.dumps(cursor, sort_keys=True))
