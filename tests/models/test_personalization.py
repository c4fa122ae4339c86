"""The personalization pipeline end to end on the simulated days: Ray Train, the MLflow registry,
the promotion gate, rollback through the CLI, and checksums that refuse a corrupted artifact."""

from __future__ import annotations

import dataclasses
import os

import pytest
from click.testing import CliRunner
from dagster import AssetKey

from cli.main import main
from engines.data.releases import NO_RELEASE, RELEASES_TAG
from engines.models.registry import CorruptArtifactError, ModelRegistry
from ml.personalization import PersonalizationModel
from resources.ray import RayResource
from tests.conftest import LAST_DAY, copy_registry
from tests.models.conftest import train

MODEL = "personalization"


def materialization(result, key: str):
    return result.asset_materializations_for_node(key.replace("/", "__"))[0]


def test_training_loss_falls_and_the_model_beats_popularity(trained):
    """A first version has no champion to beat, yet it is promoted only if it beats the popularity
    baseline on held-out AUC, recall@10 and NDCG@10: the trained model does, on all three."""
    registry, result, _ = trained
    version = registry.get(MODEL, "1")
    assert registry.by_alias(MODEL, "challenger").version == "1"
    metrics = version.metrics
    for metric in ("auc", "recall_at_10", "ndcg_at_10"):
        assert metrics[f"model_{metric}"] > metrics[f"popularity_{metric}"], (metric, metrics)
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks == {"beats_champion": True, "beats_baseline": True}
    promoted = [
        e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(["models", f"{MODEL}_champion"])
    ]
    assert promoted and result.success
    assert registry.by_alias(MODEL, "champion").version == "1"
    curve = materialization(result, "models/personalization").metadata["loss_curve"].value
    losses = [float(line.split("|")[2]) for line in curve.splitlines()[2:]]
    assert len(losses) >= 3 and losses[-1] < losses[0]


def test_every_version_carries_its_lineage(trained):
    registry, result, _ = trained
    tags = registry.get(MODEL, "1").tags
    assert tags["mlplane.dagster_run_id"] == result.run_id
    assert tags["mlplane.dagster_asset"] == AssetKey(["models", MODEL]).to_user_string()
    assert tags["mlplane.feature_service"] == "personalization_ranking"
    assert tags["mlplane.data_partitions"].split(",")[-1] == LAST_DAY.isoformat()
    assert len(tags["mlplane.code_version"]) >= 12
    assert tags[RELEASES_TAG] == NO_RELEASE  # the simulated days have no human relevance release
    assert {
        "metric.model_auc",
        "metric.model_recall_at_10",
        "metric.model_ndcg_at_10",
        "metric.popularity_recall_at_10",
    } <= set(tags)


def test_registry_round_trip_loads_the_trained_model(trained, models_lake, tmp_path):
    registry, _, _ = trained
    folder = registry.load(MODEL, "1", tmp_path / "v1")
    model = PersonalizationModel.load(folder)
    assert (folder / "loss_curve.png").stat().st_size > 0
    from engines.data.lake import Lake

    rows = Lake(models_lake).read_partition("datasets", "personalization_training", LAST_DAY).head(50)
    scores = model.score(rows)
    assert scores.shape == (50,) and len(set(scores.round(6).tolist())) > 1


def test_a_lone_worker_takes_every_cpu_of_the_in_process_ray(trained, ray_compute, tmp_path):
    """The worker reserves its share of the run's own Ray and runs that many torch threads (its spec
    records them); a cluster, shared with other jobs, gives one unless configured."""
    registry, _, _ = trained
    spec = PersonalizationModel.load(registry.load(MODEL, "1", tmp_path / "v1")).spec
    assert spec.config.num_workers == 1 and spec.config.cpus_per_worker == ray_compute.num_cpus == 2
    assert ray_compute.cpus_per_worker(2) == 1 and ray_compute.cpus_per_worker(3) == 1
    assert RayResource(address="ray://head:10001").cpus_per_worker(1) == 1
    assert RayResource(address="ray://head:10001", train_cpus_per_worker=8).cpus_per_worker(1) == 8


def test_training_in_the_runs_own_process_learns_what_a_worker_learns(models_lake, ray_compute, tmp_path):
    """Ray Train's local mode (num_workers=0, ml/ray_train.py) runs the same loop in this process: same seed,
    rows and threads, same weights and losses as one Ray Train worker; no checkpoint is left behind, and
    this process keeps its torch threads."""
    import torch

    from engines.data.lake import Lake
    from ml.personalization import TrainConfig
    from ml.personalization import train as train_model

    rows = Lake(models_lake).read_partition("datasets", "personalization_training", LAST_DAY)
    config = TrainConfig(epochs=2, cpus_per_worker=1)
    threads = torch.get_num_threads()
    worker = train_model(rows, config, tmp_path / "worker")
    local = train_model(rows, dataclasses.replace(config, num_workers=0), tmp_path / "local")
    assert torch.get_num_threads() == threads
    assert local.loss_curve == pytest.approx(worker.loss_curve, rel=1e-6) and len(local.loss_curve) == 2
    trained = local.model.network.state_dict()
    for name, tensor in worker.model.network.state_dict().items():
        torch.testing.assert_close(trained[name], tensor)
    assert not list((tmp_path / "local" / "staging").iterdir())
    assert not list((tmp_path / "worker" / "staging").iterdir())


def test_gate_blocks_a_worse_challenger_then_rollback_and_corruption(trained, models_lake, ray_compute, tmp_path):
    # a copy of its own: the version it adds and the artifact it corrupts would fail the module's other tests
    root = copy_registry(trained[2], tmp_path / "registry")
    registry = ModelRegistry.local(root)
    # margin 0: better than the champion on every gated metric, which a version trained again on the same
    # data is not; the blocking check fails, the champion stays; its worker took one of Ray's two CPUs,
    # as configured, leaving the other to runs alongside
    blocked = train(models_lake, ray_compute, root, margin=0.0, raise_on_error=False, cpus_per_worker=1)
    assert not blocked.success
    assert PersonalizationModel.load(registry.load(MODEL, "2", tmp_path / "v2")).spec.config.cpus_per_worker == 1
    checks = {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
        for e in blocked.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }
    assert checks["beats_champion"] is False
    assert registry.by_alias(MODEL, "challenger").version == "2"
    assert registry.by_alias(MODEL, "champion").version == "1"
    assert not any(
        e.asset_key == AssetKey(["models", f"{MODEL}_champion"])
        for e in blocked.get_asset_materialization_events()
        if hasattr(e, "asset_key")
    )

    # promoted by hand, then rolled back with the CLI: the alias returns and who/why are recorded
    registry.set_alias(MODEL, "champion", "2", who="test", reason="manual promotion")
    runner = CliRunner()
    env = {"MLPLANE_PROFILE": "local", "MLPLANE_DATA_DIR": str(root.parent / "unused")}
    out = runner.invoke(
        main,
        [
            "models",
            "rollback",
            "--reason",
            "v2 hurts conversion",
            "--who",
            "alice",
            "--data-dir",
            str(root.parent / "cli-lake"),
        ],
        env=env,
    )
    assert out.exit_code != 0 and "no model registry" in out.output
    os.makedirs(root.parent / "cli-lake", exist_ok=True)
    (root.parent / "cli-lake" / "registry").symlink_to(root)
    out = runner.invoke(
        main,
        [
            "models",
            "rollback",
            "--reason",
            "v2 hurts conversion",
            "--who",
            "alice",
            "--data-dir",
            str(root.parent / "cli-lake"),
        ],
        env=env,
    )
    assert out.exit_code == 0, out.output
    assert "v2 -> v1" in out.output
    assert registry.by_alias(MODEL, "champion").version == "1"
    last = registry.alias_log(MODEL, "champion")[-1]
    assert (last["action"], last["who"], last["reason"], last["from"], last["version"]) == (
        "rollback",
        "alice",
        "v2 hurts conversion",
        "2",
        "1",
    )
    listing = runner.invoke(main, ["models", "list", "--data-dir", str(root.parent / "cli-lake")], env=env)
    aliases = {
        line.split()[0]: set(line.split("[", 1)[1].split("]", 1)[0].split(","))
        for line in listing.output.splitlines()
        if line.startswith("v") and "[" in line
    }
    assert "champion" in aliases["v1"] and "challenger" in aliases["v2"] and "champion" not in aliases["v2"]

    # a flipped byte in the stored artifact is refused on load
    stored = next(p for p in (root / "artifacts").rglob("model.pt") if registry.get(MODEL, "2").run_id in str(p))
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(CorruptArtifactError, match=r"model\.pt.*do not match"):
        registry.load(MODEL, "2", root.parent / "download")
