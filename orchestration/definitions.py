"""The one Definitions object of mlplane. It assembles; the domains compute."""

from dagster import Definitions, EnvVar, in_process_executor

from assets import all_asset_checks, all_assets
from jobs import all_jobs
from orchestration.profiles import current_profile, resources_for
from orchestration.schedules import daily_pipeline_schedule, training_schedules
from orchestration.sensors import freshness_sensor, landing_sensor, notify_run_failure
from orchestration.streaming import streaming_job_sensor
from resources.model_server import ModelServerResource

# the online model server (`mlplane serve models`): localhost by default, the deployed URL in prod
model_server = ModelServerResource(url=EnvVar("MLPLANE_MODEL_SERVER_URL")) if current_profile() == "prod" \
    else ModelServerResource()

defs = Definitions(
    assets=all_assets,
    asset_checks=all_asset_checks,
    jobs=all_jobs,
    schedules=[daily_pipeline_schedule, *training_schedules],
    sensors=[landing_sensor, notify_run_failure, freshness_sensor, streaming_job_sensor],
    resources={**resources_for(current_profile()), "model_server": model_server},
    # One process per run: on small machines the per-step process start (Feast, GX imports) costs
    # more than it saves, and GX's project file must not be written by two steps at once.
    executor=in_process_executor,
)
