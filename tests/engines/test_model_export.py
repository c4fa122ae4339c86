"""The Triton and KServe exports (engines/models/model_export.py, engines/models/kserve.py,
serving/models/export_check.py): real registry models (the model code with random weights: an export must
reproduce a model, not a good one) in a real MLflow registry, exported to TorchScript, loaded back with
torch.jit and compared with the model as the server loads it; manifests validated against KServe's v1beta1
InferenceService fields."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import yaml

from engines.models import kserve
from engines.models.model_export import (
    CONFIG_FILE,
    MODEL_FILE,
    PYTHON_MODEL_FILE,
    PYTHON_MODEL_SOURCE,
    SOURCE_FILE,
    ExportTarget,
    export_target,
    load_exported,
    parse_config,
    publish,
    python_config_file,
)
from engines.models.registry import CHECKSUM_TAG, ModelRegistry
from ml.clip import ClipSpec, load_model
from ml.personalization import PersonalizationModel, TrainConfig, TwoTower, build_spec
from serving.models.config import ServerConfig
from serving.models.export_check import ATOL, compare_export
from tests.serving.models.conftest import register_two_tower


def register_clip(registry: ModelRegistry, root: Path, seed: int = 0) -> str:
    """The compact CLIP config with random weights, registered as the `models/clip` asset registers it."""
    folder = root / f"clip-{seed}"
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    torch.save(load_model(ClipSpec()).state_dict(), folder / "clip.pt")
    (folder / "clip.json").write_text(json.dumps({"model_name": ClipSpec().model_name}))
    version = registry.register("clip", folder, {}, {}).version
    registry.set_alias("clip", "champion", version, who="test", reason="fixture")
    return version


def build_registry(root: Path) -> ModelRegistry:
    """personalization v1 champion, v2 challenger; clip v1 champion."""
    registry = ModelRegistry.local(root / "registry")
    register_two_tower(registry, root, seed=1, alias="champion")
    register_two_tower(registry, root, seed=2, alias="challenger")
    register_clip(registry, root)
    return registry


def target(registry: ModelRegistry, name: str, model: str, kind: str, version: str) -> ExportTarget:
    checksum = registry.get(model, version).tags[CHECKSUM_TAG]
    return ExportTarget(name, model, kind, version, f"version {version}", checksum)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every exportable served model of the registry, exported into one repository."""
    root = tmp_path_factory.mktemp("export")
    registry = build_registry(root)
    repository = root / "repository"
    out = []
    for t in (
        target(registry, "personalization", "personalization", "two_tower", "1"),
        target(registry, "clip_text", "clip", "clip_text", "1"),
        target(registry, "clip_image", "clip", "clip_image", "1"),
    ):
        folder = registry.load(t.registry_model, t.version, root / "artifacts" / t.name)
        out += [(model, folder) for model in export_target(t, folder, repository)]
    return registry, repository, out, root


def test_every_export_gives_the_served_models_outputs(exported):
    _, repository, models, _ = exported
    assert sorted(m.name for m, _ in models) == [
        "clip_image",
        "clip_text",
        "personalization-item_tower",
        "personalization-user_tower",
    ]
    for model, folder in models:
        result = compare_export(repository, model, folder)
        assert result.passed, result
        assert result.max_abs_diff <= ATOL, result  # the tolerance is not what makes it pass


def test_config_pbtxt_declares_the_traced_inputs_and_pins_the_version(exported):
    _, repository, models, _ = exported
    for model, _ in models:
        config = parse_config((model.folder(repository) / CONFIG_FILE).read_text())
        assert config.name == model.name and config.platform == "pytorch_libtorch"
        assert list(config.version_policy.specific.versions) == [1]
        script = load_exported(repository, model)
        schema = str(script.forward.schema)
        if model.part.endswith("tower"):  # Triton passes one Dict[str, Tensor] keyed by the input names
            assert "Dict(str, Tensor) inputs" in schema
        else:  # Triton matches an input to the forward argument of its name
            assert f"Tensor {config.input[0].name}" in schema
        source = json.loads((model.folder(repository) / "1" / SOURCE_FILE).read_text())
        assert source["checksum"] == model.target.checksum and source["torch"] == torch.__version__
        # the Python-backend configuration (CPU images without libtorch) serves the same tensors
        python = parse_config(python_config_file(model.folder(repository)).read_text())
        assert python.backend == "python" and not python.platform
        assert python.input == config.input and python.output == config.output
        assert list(python.version_policy.specific.versions) == [1]
        assert (model.folder(repository) / "1" / PYTHON_MODEL_FILE).read_text() == PYTHON_MODEL_SOURCE.read_text()


def test_a_different_model_or_a_wrong_config_fails_the_comparison(exported, tmp_path):
    registry, repository, models, root = exported
    user_tower, v1_folder = next((m, f) for m, f in models if m.name == "personalization-user_tower")
    v2 = target(registry, "personalization", "personalization", "two_tower", "2")
    v2_folder = registry.load("personalization", "2", tmp_path / "v2")
    other = tmp_path / "other"
    v2_user = next(m for m in export_target(v2, v2_folder, other) if m.part == "user_tower")
    # v2's export judged against v1 (a stale or mixed-up artifact): the outputs differ
    mixed = compare_export(other, v2_user, v1_folder)
    assert not mixed.passed and mixed.max_abs_diff > 1e-2
    # a config.pbtxt that declares another width than the tower reads
    config_file = v2_user.folder(other) / CONFIG_FILE
    config_file.write_text(
        config_file.read_text().replace(
            'name: "numeric"\n  data_type: TYPE_FP32\n  dims: 1', 'name: "numeric"\n  data_type: TYPE_FP32\n  dims: 2'
        )
    )
    broken = compare_export(other, v2_user, v2_folder)
    assert not broken.passed and "'numeric'" in broken.problem
    # the untouched v1 export still passes: the failures above come from the changes
    assert compare_export(repository, user_tower, v1_folder).passed


def test_tower_with_clip_embeddings_and_no_categories_exports_exactly(tmp_path):
    rng = np.random.default_rng(3)
    frame = pl.DataFrame(
        {
            "user_id": [1, 2, 3],
            "item_id": [10, 11, 12],
            "user_engagement__clicks_7d": [1.0, 5.0, 0.0],
            "item_content__price": [3.0, 9.5, 1.0],
            "item_embedding": rng.normal(size=(3, 6)).astype(np.float32).tolist(),
            "label": [1.0, 0.0, 1.0],
        }
    )
    torch.manual_seed(5)
    spec = build_spec(frame, TrainConfig(dim=4, hidden=8), item_embeddings=frame.select("item_id", "item_embedding"))
    assert spec.item.embedding_column and not spec.item.categorical and not spec.user.histories
    folder = PersonalizationModel(TwoTower(spec)).save(tmp_path / "model")
    t = ExportTarget("personalization", "personalization", "two_tower", "7", "alias 'champion'", "sum")
    for model in export_target(t, folder, tmp_path / "repository"):
        names = [i.name for i in parse_config((model.folder(tmp_path / "repository") / CONFIG_FILE).read_text()).input]
        assert "categorical" not in names
        result = compare_export(tmp_path / "repository", model, folder, seed=11)
        assert result.passed, result


def test_publish_keeps_versions_and_moves_the_pin(exported, tmp_path):
    registry, staging, models, root = exported
    live = tmp_path / "live"
    first = publish(staging, live, [m for m, _ in models])
    assert sorted(first["written"]) == sorted(m.name for m, _ in models) and not first["removed"]
    again = publish(staging, live, [m for m, _ in models])
    assert not again["written"] and len(again["unchanged"]) == len(models)
    # v2 becomes the served version: its folder joins v1's, the pin moves; the encoders are no longer served
    v2 = target(registry, "personalization", "personalization", "two_tower", "2")
    v2_models = export_target(v2, registry.load("personalization", "2", tmp_path / "v2"), tmp_path / "staging2")
    moved = publish(tmp_path / "staging2", live, v2_models)
    assert sorted(moved["removed"]) == ["clip_image", "clip_text"]
    user = live / "personalization-user_tower"
    assert (user / "1" / MODEL_FILE).exists() and (user / "2" / MODEL_FILE).exists()
    assert list(parse_config((user / CONFIG_FILE).read_text()).version_policy.specific.versions) == [2]
    assert list(parse_config(python_config_file(user).read_text()).version_policy.specific.versions) == [2]
    assert (user / "2" / PYTHON_MODEL_FILE).exists()
    assert not [p for p in live.rglob("*") if p.name.startswith(".")]  # nothing half-written left behind


# --- KServe ------------------------------------------------------------------------------------------
SERVER = {
    "lake_root": "/data/lake",
    "registry_root": "/data/lake/registry",
    "tracking_uri": None,
    "online_store": "redis",
    "redis_url": "redis.internal:6379",
    "poll_interval_s": 2.0,
}


def manifests(version: str = "3") -> list[dict]:
    t = ExportTarget("clip_text", "clip", "clip_text", version, "alias 'champion'", "abc123")
    return kserve.predictor_manifests(t, SERVER, "/data/lake", kserve.KServeSettings())


def test_generated_manifests_validate_against_kserve_fields():
    config, isvc = manifests()
    assert kserve.problems(config) == [] and kserve.problems(isvc) == []
    triton = kserve.triton_manifest(
        [ExportTarget("clip_text", "clip", "clip_text", "3", "a", "c")],
        kserve.KServeSettings(triton_runtime_version="25.01-py3"),
    )
    assert kserve.problems(triton) == []
    assert isvc["metadata"]["name"] == "mlplane-clip-text"
    # KServe's own sample of a custom predictor (docs/samples/v1beta1/custom/prebuilt-image) validates too
    sample = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"labels": {"controller-tools.k8s.io": "1.0"}, "name": "custom-prebuilt-image"},
        "spec": {
            "predictor": {
                "containers": [
                    {
                        "name": "custom",
                        "image": "codait/max-object-detector",
                        "ports": [{"containerPort": 5000, "protocol": "TCP"}],
                    }
                ]
            }
        },
    }
    assert kserve.problems(sample) == []


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("spec", "predictor", "containers", 0, "imagePullPolicyy"), "Always", "imagePullPolicyy"),  # not a field
        (("spec", "predictor", "minReplicas"), "two", "'two' is not of type 'integer'"),
        (("spec", "predictor", "containers", 0, "ports", 0, "containerPort"), None, "None is not of type 'integer'"),
        (("spec", "predictor", "canaryTrafic"), 10, "canaryTrafic"),
        (("spec", "transformer"), {"containers": [{"image": "x"}]}, "'name' is a required property"),
        (("metadata", "name"), "Mlplane_Clip", "not a valid InferenceService name"),
        (("apiVersion",), "serving.kserve.io/v1alpha1", "no schema for InferenceService"),
    ],
)
def test_manifest_schema_rejects_what_kserve_would(path, value, expected):
    isvc = copy.deepcopy(manifests()[1])
    node = isvc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    found = kserve.problems(isvc)
    assert any(expected in p for p in found), found


def test_missing_predictor_is_rejected_and_nothing_is_written(tmp_path):
    isvc = manifests()[1]
    del isvc["spec"]["predictor"]
    (tmp_path / "old.yaml").write_text("kept: true\n")
    with pytest.raises(kserve.ManifestError, match="'predictor' is a required property"):
        kserve.write_manifests(tmp_path, {"mlplane-clip-text.yaml": [isvc]})
    assert [p.name for p in tmp_path.iterdir()] == ["old.yaml"]


def test_the_pods_server_config_is_a_server_config_pinned_to_the_version(tmp_path):
    config, isvc = manifests("3")
    pod = ServerConfig.model_validate(yaml.safe_load(config["data"]["server.yaml"]))
    assert [(m.name, m.version, m.alias) for m in pod.models] == [("clip_text", "3", None)]
    assert pod.lake_root == "/mnt/lake" and pod.registry_root == "/mnt/lake/registry"
    assert pod.redis_url == "redis.internal:6379"
    container = isvc["spec"]["predictor"]["containers"][0]
    assert container["args"][:2] == ["--config", "/etc/mlplane/server.yaml"]
    assert isvc["metadata"]["annotations"]["mlplane.io/registry-version"] == "3"
    written = kserve.write_manifests(tmp_path, {"mlplane-clip-text.yaml": [config, isvc]})
    assert list(yaml.safe_load_all(written[0].read_text())) == [config, isvc]


def test_deployment_manifests_add_triton_only_for_exported_targets_and_name_each_problem():
    served = [
        ExportTarget("clip_text", "clip", "clip_text", "3", "alias 'champion'", "abc"),
        ExportTarget("recs", "personalization", "towers", "7", "alias 'champion'", "def"),
    ]
    settings = kserve.KServeSettings(triton_runtime_version="25.01-py3")
    without = kserve.deployment_manifests(served, [], SERVER, "/data/lake", settings)
    assert sorted(without) == ["mlplane-clip-text.yaml", "mlplane-recs.yaml"]
    with_triton = kserve.deployment_manifests(served, served[:1], SERVER, "/data/lake", settings)
    assert sorted(with_triton) == sorted([*without, kserve.TRITON_MANIFEST])
    assert kserve.all_problems(with_triton) == {}
    del with_triton["mlplane-recs.yaml"][1]["spec"]["predictor"]
    found = kserve.all_problems(with_triton)
    assert (
        list(found) == ["mlplane-recs.yaml[1]"]
        and "'predictor' is a required property" in found["mlplane-recs.yaml[1]"][0]
    )
