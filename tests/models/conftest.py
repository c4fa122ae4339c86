"""Fixtures of the model tests: one capped in-process Ray for the session, and the personalization
pipeline trained once over a copy of the shared three simulated days, its lake copied for the
tests that write to it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dagster import AssetSelection, DagsterInstance, materialize

from assets import all_assets
from assets.models import train_personalization
from engines.models.registry import ModelRegistry
from orchestration.profiles import resources_for
from resources.ray import RayResource
from resources.registry import ModelRegistryResource
from tests.conftest import LAST_DAY, copy_registry, training_result

MODEL_ASSETS = AssetSelection.assets(*train_personalization.assets)  # the model and its promotion


@pytest.fixture(scope="session")
def ray_compute(tmp_path_factory):
    resource = RayResource(num_cpus=2, object_store_mb=300, temp_dir=str(tmp_path_factory.mktemp("ray")))
    with resource.session():
        yield resource


def train(
    data_dir: Path,
    ray_compute: RayResource,
    registry_root: Path,
    margin: float = 0.0,
    raise_on_error: bool = True,
    cpus_per_worker: int | None = None,
):
    """The training job's assets for the newest simulated day (the worker on `cpus_per_worker` CPUs of
    Ray's, None: its share)."""
    resources = {
        **resources_for("local", data_dir=str(data_dir)),
        "ray": ray_compute,
        "model_registry": ModelRegistryResource(root=str(registry_root), promotion_margin=margin),
    }
    return materialize(
        all_assets,
        selection=MODEL_ASSETS,
        resources=resources,
        partition_key=LAST_DAY.isoformat(),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=raise_on_error,
        run_config={"ops": {"models__personalization": {"config": {"cpus_per_worker": cpus_per_worker}}}},
    )


@pytest.fixture(scope="session")
def models_lake(pipeline_dir, tmp_path_factory) -> Path:
    """The pipeline's lake, copied: training and batch inference write to the lake they run over, and
    the shared lake is read by other workers meanwhile."""
    return shutil.copytree(pipeline_dir, tmp_path_factory.mktemp("models") / "lake")


@pytest.fixture(scope="session")
def trained(ray_compute, personalization_run, tmp_path_factory):
    """The registry after one training run (v1) and the run's result. v1 is the champion, promoted by
    the run itself: it beat the popularity baseline (asserted on in test_personalization). The run is the
    suite's (tests/conftest.py `personalization_run`, after this worker's Ray: a build here uses it); the
    registry a copy these tests may add versions to and corrupt."""
    root = copy_registry(personalization_run / "registry", tmp_path_factory.mktemp("trained") / "registry")
    return ModelRegistry.local(root), training_result(personalization_run), root
