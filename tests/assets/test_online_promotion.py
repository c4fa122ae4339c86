"""Promotion from evidence: a pipeline built with `promotion_evidence="online"` promotes the challenger that
beat the champion in an A/B test (monitoring's comparisons, computed by the online-accuracy engine from
logged answers and outcomes), even when its held-out score is worse, and refuses it when the online
difference is not significant. A first version, with no champion to beat, is still held to its
training function's baseline. The toy training function registers small folders (the gate is under
test, not a model); Ray is real, as the SDK starts it."""

from __future__ import annotations

import dataclasses

import pytest
from dagster import AssetSelection, DagsterInstance, DailyPartitionsDefinition, materialize

from assets.pipelines import APPROVED_ALIAS, BASELINE_CHECK, GATE_CHECK, TrainedModel, TrainingRun, training_pipeline
from engines.data.lake import Lake
from engines.experimentation.online_accuracy import (
    COMPARISONS_TABLE,
    ZONE,
    by_experiment,
    experiment_users,
    scored_answers,
)
from engines.experimentation.prediction_logs import frame
from engines.models.registry import ModelRegistry
from resources.lake import LakeResource
from resources.ray import RayResource
from resources.registry import ModelRegistryResource
from tests.assets.test_promotion_gate import comparisons as simulated_comparisons
from tests.engines.test_online_accuracy import SETTINGS, T0, simulated

pytestmark = pytest.mark.services  # starts Ray


@pytest.fixture(scope="module")
def ray(tmp_path_factory):
    resource = RayResource(num_cpus=1, object_store_mb=100, temp_dir=str(tmp_path_factory.mktemp("ray")))
    with resource.session():
        yield resource


def toy(name: str, auc: float, compare=None, baseline: dict | None = None, **options):
    """A pipeline whose training function registers a small folder scoring `auc` on held-out data and
    compares it with the champion with `compare` (default: a simulated challenger worse than it)."""

    @training_pipeline(
        name,
        description="A toy model for the promotion gates",
        deps=[],
        partitions_def=DailyPartitionsDefinition(start_date="2026-01-01"),
        **options,
    )
    def train(run: TrainingRun) -> TrainedModel:
        folder = run.workdir / "model"
        folder.mkdir()
        (folder / "weights.txt").write_text(f"trained for {run.day}")
        return TrainedModel(
            folder,
            {"auc": auc},
            "auc",
            compare=lambda champion_dir: (compare or (lambda: simulated_gate(1, 0.5, 1.5)))(),
            data_partitions=[str(run.day)],
            feature_service="personalization_ranking",
            baseline=baseline or {},
        )

    return train


def simulated_gate(seed: int, champion_noise: float, challenger_noise: float) -> dict:
    """The gate metric's paired comparison of two simulated models (tests.assets.test_promotion_gate)."""
    return simulated_comparisons(seed, champion_noise, challenger_noise)


def run_checks(pipeline, tmp_path, ray) -> dict:
    """The pipeline's check evaluations by name, its assets run for T0's day under `tmp_path`."""
    result = materialize(
        pipeline.assets,
        selection=AssetSelection.all(),
        resources={
            "lake": LakeResource(root=str(tmp_path / "lake")),
            "model_registry": ModelRegistryResource(root=str(tmp_path / "registry")),
            "ray": ray,
        },
        partition_key=T0.date().isoformat(),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def registered(root, tmp_path, name: str = "toy_online") -> ModelRegistry:
    registry = ModelRegistry.local(root)
    for version, alias in (("1", "champion"), ("2", "challenger")):
        folder = tmp_path / f"v{version}"
        folder.mkdir()
        (folder / "weights.txt").write_text(version)
        registry.register(name, folder, {}, {"auc": 0.5})
        registry.set_alias(name, alias, version, who="test", reason="setup")
    return registry


@pytest.mark.parametrize("lift, promoted", [(0.12, True), (0.0, False)])
def test_the_online_gate_promotes_the_challenger_only_on_a_significant_online_lift(tmp_path, ray, lift, promoted):
    registry = registered(tmp_path / "registry", tmp_path)
    records, events = simulated(21, users=400, lift=lift)  # control served v1 (champion), treatment v2
    sized = dataclasses.replace(SETTINGS, minimum_effect=0.3)  # a plan 400 users nearly complete (one look)
    answers = scored_answers(frame(records), events, sized)
    comparisons = by_experiment(experiment_users(answers, T0.date()), {"ab": "control"}, sized)
    Lake(tmp_path / "lake").write_partition(ZONE, COMPARISONS_TABLE, T0.date(), comparisons)
    pipeline = toy("toy_online", auc=0.1, promotion_evidence="online")  # worse offline
    gate = run_checks(pipeline, tmp_path, ray)[GATE_CHECK]
    assert gate.passed is promoted, gate.description
    assert registry.by_alias("toy_online", "champion").version == ("2" if promoted else "1")
    assert registry.by_alias("toy_online", "challenger").version == "3"  # the new version is tested next
    assert gate.metadata["online_source"].value == "ab"
    if not promoted:
        assert "not significant" in gate.description


@pytest.mark.parametrize("baseline_auc, promoted", [(0.6, True), (0.8, False)])
def test_a_first_version_short_of_its_baseline_is_not_promoted(tmp_path, ray, baseline_auc, promoted):
    pipeline = toy("toy_first", auc=0.7, baseline={"auc": baseline_auc})  # no champion yet
    checks = run_checks(pipeline, tmp_path, ray)
    assert checks[GATE_CHECK].passed  # nothing to beat
    assert checks[BASELINE_CHECK].passed is promoted, checks[BASELINE_CHECK].description
    assert ("0.7000 | " + f"{baseline_auc:.4f}") in checks[BASELINE_CHECK].metadata["comparison"].value
    champion = ModelRegistry.local(tmp_path / "registry").by_alias("toy_first", "champion")
    assert (champion.version if champion else None) == ("1" if promoted else None)


@pytest.mark.parametrize("challenger_noise, promoted", [(1.5, False), (0.5, True)])
def test_the_held_out_gate_promotes_a_real_gain_and_clears_approved_on_a_tie(tmp_path, ray, challenger_noise, promoted):
    registry = registered(tmp_path / "registry", tmp_path, "toy_gate")
    registry.set_alias("toy_gate", APPROVED_ALIAS, "2", who="test", reason="an earlier verdict")
    # two seeds of one model (a tie), or a model with a third of the champion's noise (a real gain)
    pipeline = toy("toy_gate", auc=0.7, compare=lambda: simulated_gate(3, 1.5, challenger_noise))
    gate = run_checks(pipeline, tmp_path, ray)[GATE_CHECK]
    assert gate.passed is promoted, gate.description
    assert "| auc |" in gate.metadata["offline_comparisons"].value
    approved = registry.by_alias("toy_gate", APPROVED_ALIAS)
    assert (approved.version if approved else None) == ("3" if promoted else None)  # cleared on failure
    assert registry.by_alias("toy_gate", "champion").version == ("3" if promoted else "1")
