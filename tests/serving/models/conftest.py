"""Fixtures of the model-server tests: a real MLflow registry holding real two-tower models (built
from the model code with random weights: the protocol tests need real models, not good ones), and the
server itself on a free port, run by uvicorn in this process as `mlplane serve models` runs it."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
import torch
import uvicorn

from engines.models.registry import LOG_INPUTS_TAG, ModelRegistry
from ml.personalization import PersonalizationModel, TrainConfig, TwoTower, build_spec
from serving.models.config import ModelEntry, ServerConfig
from serving.models.protocols.app import create_app
from serving.models.server import ModelServer
from tests.untrained import with_drawn_outputs

ADMIN_KEY = "admin-key-of-the-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TOWER_ENTRIES = [
    ModelEntry(name="personalization", registry_model="personalization", kind="two_tower"),
    ModelEntry(
        name="personalization-challenger", registry_model="personalization", kind="two_tower", alias="challenger"
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_two_tower(seed: int) -> PersonalizationModel:
    """A two-tower model over a few columns of each kind (numeric, categorical, history), random weights."""
    frame = pl.DataFrame(
        {
            "user_id": [1, 2, 3, 4],
            "item_id": [10, 11, 12, 13],
            "user_profile__region": ["eu", "us", "eu", "apac"],
            "user_engagement__clicks_7d": [1.0, 5.0, 0.0, 2.0],
            "user_engagement__last_clicked_items": [[10, 11], [], [12], [13, 10]],
            "item_content__price": [3.0, 9.5, 1.0, 4.0],
            "item_content__category": ["art", "game", "art", "toy"],
            "label": [1.0, 0.0, 1.0, 0.0],
        }
    )
    torch.manual_seed(seed)
    network = TwoTower(build_spec(frame, TrainConfig(dim=8, hidden=16)))
    network.set_prior(frame)  # items 10 and 12 get a popularity prior, as trained models do
    network.prior_weight.data.fill_(0.1 * seed)
    return PersonalizationModel(with_drawn_outputs(network))  # so that every weight counts


def register_two_tower(registry: ModelRegistry, folder: Path, seed: int, alias: str | None = None) -> str:
    model_dir = tiny_two_tower(seed).save(folder / f"tower-{seed}")
    version = registry.register(
        "personalization", model_dir, {"mlplane.feature_service": "personalization_ranking"}, {"model_auc": 0.5}
    )
    if alias:
        registry.set_alias("personalization", alias, version.version, who="test", reason="fixture")
    return version.version


def keyed_server(config: ServerConfig, admin_key: str | None, data_key: str | None) -> ModelServer:
    """The server with these keys in the environment variables its config names (read once, at start)."""
    with pytest.MonkeyPatch.context() as env:
        for variable, key in ((config.admin_key_env, admin_key), (config.data_key_env, data_key)):
            if key is None:
                env.delenv(variable, raising=False)
            else:
                env.setenv(variable, key)
        return ModelServer(config)


@dataclass
class RunningServer:
    server: ModelServer
    url: str
    port: int
    uvicorn: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(30)


def start_server(
    config: ServerConfig, grpc_port: int | None = None, admin_key: str | None = ADMIN_KEY, data_key: str | None = None
) -> RunningServer:
    server = keyed_server(config, admin_key, data_key)
    port = free_port()
    app = create_app(server, grpc_port=grpc_port)
    runner = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.time() + 120
    while not runner.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("model server did not start")
        time.sleep(0.05)
    return RunningServer(server, f"http://127.0.0.1:{port}", port, runner, thread)


@pytest.fixture(scope="session")
def tower_registry(tmp_path_factory) -> tuple[ModelRegistry, Path]:
    """v1 champion, v2 challenger."""
    root = tmp_path_factory.mktemp("serving_registry")
    registry = ModelRegistry.local(root / "registry")
    register_two_tower(registry, root, seed=1, alias="champion")
    register_two_tower(registry, root, seed=2, alias="challenger")
    return registry, root


@pytest.fixture(scope="package")  # its pollers stop with this package
def tower_server(tower_registry, tmp_path_factory):
    """The server over the registry's towers (no lake: no catalogue, so no item scores)."""
    registry, root = tower_registry
    lake = tmp_path_factory.mktemp("serving_lake")
    config = ServerConfig(
        registry_root=str(root / "registry"),
        lake_root=str(lake),
        models=TOWER_ENTRIES,
        poll_interval_s=0.2,
        feature_log_sample=0.0,
    )
    running = start_server(config)
    yield running
    running.stop()


def register_random_clip(registry: ModelRegistry, folder: Path) -> str:
    """The compact CLIP with random weights as registry model `clip` (champion), laid out as the asset
    `models/clip` registers it."""
    import json

    from ml.clip import ClipSpec, load_model
    from serving.models.kinds.encoders import CONFIG_FILE, WEIGHTS_FILE

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.save(load_model(ClipSpec()).state_dict(), folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps({"model_name": ClipSpec().model_name, "version": "random"}))
    version = registry.register("clip", folder, {}, {})
    registry.set_alias("clip", "champion", version.version, who="test", reason="fixture")
    return version.version


@pytest.fixture(scope="package")  # its pollers stop with this package
def clip_server(tmp_path_factory):
    """The CLIP encoders (random weights) over an empty lake, with a small pixel limit."""
    root = tmp_path_factory.mktemp("clip_registry")
    register_random_clip(ModelRegistry.local(root / "registry"), root / "clip")
    config = ServerConfig(
        registry_root=str(root / "registry"),
        lake_root=str(tmp_path_factory.mktemp("clip_lake")),
        models=[
            ModelEntry(name="clip_text", registry_model="clip", kind="clip_text"),
            ModelEntry(name="clip_image", registry_model="clip", kind="clip_image"),
        ],
        feature_log_sample=0.0,
        max_image_pixels=4096 * 4096,
    )
    running = start_server(config)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def served_lake(personalization_run, tmp_path_factory) -> Path:
    """A copy of the lake the suite's personalization run trained over (this suite writes to its online
    store) with a registry holding the model that run trained, registered and promoted through its Dagster
    assets (champion), and CLIP registered by the `models/clip` asset from weights the `clip_model` asset
    chose (the compact config, random weights: the server needs a real CLIP, not a good one)."""
    import shutil

    from dagster import AssetSelection, DagsterInstance, materialize

    from assets import all_assets
    from assets.embeddings import CLIP_MODEL
    from assets.serving import CLIP_REGISTERED
    from ml.clip import ClipSpec, load_model
    from orchestration.profiles import resources_for
    from resources.registry import ModelRegistryResource
    from tests.conftest import copy_registry, training_result

    lake = tmp_path_factory.mktemp("served") / "lake"
    shutil.copytree(personalization_run / "lake", lake)
    registry_root = copy_registry(personalization_run / "registry", lake / "registry")
    assert training_result(personalization_run).success  # trained, registered, past both gates: the champion
    registry = ModelRegistry.local(registry_root)
    assert registry.by_alias("personalization", "champion").version == "1"
    # its card consents to logging its inputs: the served-features sampler writes only such models' rows
    registry.client.set_model_version_tag("personalization", "1", LOG_INPUTS_TAG, "true")
    weights = lake / "models" / "clip-random.pt"
    weights.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.save(load_model(ClipSpec()).state_dict(), weights)
    resources = {
        **resources_for("local", data_dir=str(lake)),
        "model_registry": ModelRegistryResource(root=str(registry_root)),
    }
    result = materialize(
        all_assets,
        selection=AssetSelection.assets(CLIP_MODEL, CLIP_REGISTERED),
        resources=resources,
        instance=DagsterInstance.ephemeral(),
        run_config={"ops": {"clip_model": {"config": {"checkpoint": str(weights)}}}},
    )
    assert result.success
    return lake


@pytest.fixture(scope="package")  # its pollers stop with this package
def platform_server(served_lake):
    """`mlplane serve models`' default configuration over the lake: every platform model."""
    config = ServerConfig.local(served_lake, poll_interval_s=0.5, feature_log_sample=1.0)
    running = start_server(config)
    yield running
    running.stop()
