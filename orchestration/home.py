"""The project-local Dagster instance (DAGSTER_HOME) used by the `mlplane` CLI and scripts."""

import os
import sys
from pathlib import Path

import click
from dagster import DagsterInstance

from orchestration.profiles import PROJECT_ROOT, current_profile

CODE_LOCATION = "mlplane"  # workspace.yaml's location_name: sensor state is keyed by it
DEFINITIONS_MODULE = "orchestration.definitions"


def ensure_dagster_home() -> Path:
    """Use $DAGSTER_HOME when set; otherwise .dagster_home/ in the project, with the project's dagster.yaml.
    The prod profile needs its own (deploy/prod): the local SQLite instance there would hide every run."""
    if current_profile() == "prod":
        return prod_dagster_home()
    home = Path(os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.symlink_to(PROJECT_ROOT / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def prod_dagster_home() -> Path:
    if not os.environ.get("DAGSTER_HOME"):
        raise click.ClickException("the prod profile needs DAGSTER_HOME (deploy/prod, or a copy of its dagster.yaml)")
    home = Path(os.environ["DAGSTER_HOME"])
    if not (home / "dagster.yaml").is_file():
        raise click.ClickException(f"DAGSTER_HOME={home} holds no dagster.yaml (use deploy/prod's)")
    return home


def environment_executable(name: str) -> str:
    """An executable of the environment this process runs in (`.venv/bin/dagster`), so commands work
    without an activated environment."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {name} installed in the environment of {sys.executable}?")
    return str(path)


def set_sensor_cursor(instance: DagsterInstance, sensor_name: str, cursor: str) -> None:
    """Store a sensor's cursor as the daemon of `mlplane ui` reads it (state keyed by location, repository
    and sensor name). Unlike `dagster sensor cursor --set`, a sensor that runs by default stays running."""
    from orchestration.dagster_internals import (
        InProcessCodeLocation,
        InProcessCodeLocationOrigin,
        InstigatorState,
        InstigatorStatus,
        InstigatorType,
        LoadableTargetOrigin,
        SensorInstigatorData,
    )

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(
            executable_path=sys.executable, module_name=DEFINITIONS_MODULE, working_directory=str(PROJECT_ROOT)
        ),
        location_name=CODE_LOCATION,
    )
    with InProcessCodeLocation(origin, instance) as location:
        [repository] = location.get_repositories().values()
        sensor = repository.get_sensor(sensor_name)
    stored = instance.get_instigator_state(sensor.get_remote_origin_id(), sensor.selector_id)
    data = SensorInstigatorData(min_interval=sensor.min_interval_seconds, cursor=cursor, sensor_type=sensor.sensor_type)
    if stored is None:
        instance.add_instigator_state(
            InstigatorState(sensor.get_remote_origin(), InstigatorType.SENSOR, InstigatorStatus.DECLARED_IN_CODE, data)
        )
    else:
        instance.update_instigator_state(stored.with_data(stored.instigator_data._replace(cursor=cursor)))
