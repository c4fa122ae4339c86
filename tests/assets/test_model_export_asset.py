"""The deploy/model_export asset and its sensor over a real MLflow registry: what the local model server
serves is exported, a promotion or rollback moves Triton's version pin and the manifests, and the sensor
asks for an export exactly when a served version changes."""

from __future__ import annotations

import yaml
from dagster import AssetSelection, DagsterInstance, SkipReason, build_sensor_context, materialize

from assets import all_assets
from assets.model_export import KSERVE_CHECK, MODEL_EXPORT, TRITON_CHECK
from engines.models.kserve import KSERVE_FOLDER, problems
from engines.models.model_export import CONFIG_FILE, MODEL_FILE, TRITON_REPOSITORY, parse_config
from orchestration.profiles import resources_for
from orchestration.sensors import model_export_sensor
from tests.engines.test_model_export import build_registry


def local_resources(lake) -> dict:
    """The local profile over `lake` (its registry is `lake/registry`, as build_registry makes it)."""
    return resources_for("local", data_dir=str(lake))


def run_export(lake):
    result = materialize(
        all_assets,
        selection=AssetSelection.assets(MODEL_EXPORT),
        resources=local_resources(lake),
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks[TRITON_CHECK].passed, checks[TRITON_CHECK].metadata
    assert checks[KSERVE_CHECK].passed, checks[KSERVE_CHECK].metadata
    return result


def pinned(lake, model: str) -> list[int]:
    config = (lake / TRITON_REPOSITORY / model / CONFIG_FILE).read_text()
    return list(parse_config(config).version_policy.specific.versions)


def test_export_and_its_sensor_follow_promotion_and_rollback(tmp_path):
    """One registry for both: the sensor asks for an export exactly when a served version moves, and the
    export then moves Triton's pin and the manifests."""
    lake = tmp_path / "lake"
    registry = build_registry(lake)  # personalization v1 champion, v2 challenger; clip v1
    resources = local_resources(lake)

    def tick(cursor):
        with build_sensor_context(cursor=cursor, resources=resources) as context:
            return model_export_sensor(context)

    first = tick(None)
    assert len(first.run_requests) == 1
    assert isinstance(tick(first.cursor), SkipReason)  # nothing moved: no second export
    run_export(lake)
    repository = lake / TRITON_REPOSITORY
    assert sorted(p.name for p in repository.iterdir()) == [
        "clip_image",
        "clip_text",
        "personalization-challenger-item_tower",
        "personalization-challenger-user_tower",
        "personalization-item_tower",
        "personalization-user_tower",
    ]
    assert pinned(lake, "personalization-user_tower") == [1]
    assert pinned(lake, "personalization-challenger-user_tower") == [2]
    manifests = {p.name: list(yaml.safe_load_all(p.read_text())) for p in (lake / KSERVE_FOLDER).glob("*.yaml")}
    # one InferenceService per served model of the local server (content_violation too: it has no Triton form)
    assert sorted(manifests) == [
        "mlplane-clip-image.yaml",
        "mlplane-clip-text.yaml",
        "mlplane-content-violation.yaml",
        "mlplane-item-search.yaml",
        "mlplane-personalization-challenger.yaml",
        "mlplane-personalization.yaml",
        "mlplane-triton.yaml",
    ]
    assert all(problems(doc) == [] for docs in manifests.values() for doc in docs)
    isvc = manifests["mlplane-personalization.yaml"][1]
    assert isvc["metadata"]["annotations"]["mlplane.io/registry-version"] == "1"

    registry.set_alias("personalization", "champion", "2", who="test", reason="promotion")
    promoted = tick(first.cursor)
    assert len(promoted.run_requests) == 1 and promoted.cursor != first.cursor
    assert '"personalization": "2"' in promoted.cursor
    run_export(lake)
    assert pinned(lake, "personalization-user_tower") == [2]
    assert (repository / "personalization-user_tower" / "1" / MODEL_FILE).exists()  # kept for a rollback
    registry.rollback("personalization", "champion", who="test", reason="rollback")
    rolled_back = tick(promoted.cursor)  # back to versions exported before: exported again
    assert len(rolled_back.run_requests) == 1 and rolled_back.cursor == first.cursor
    run_export(lake)
    assert pinned(lake, "personalization-user_tower") == [1]
    isvc = list(yaml.safe_load_all((lake / KSERVE_FOLDER / "mlplane-personalization.yaml").read_text()))[1]
    assert isvc["metadata"]["annotations"]["mlplane.io/registry-version"] == "1"

    registry.set_alias("personalization", "challenger", "1", who="test", reason="a new challenger")
    moved = tick(rolled_back.cursor)
    assert len(moved.run_requests) == 1 and moved.cursor != rolled_back.cursor
    assert '"personalization-challenger": "1"' in moved.cursor
