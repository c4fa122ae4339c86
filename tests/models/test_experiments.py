"""A/B experiments: configuration, deterministic and independent assignment for 20+ concurrent
experiments, clear errors for bad definitions, and the offline comparison report asset."""

from __future__ import annotations

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from assets import all_assets
from assets.experiments import EXPERIMENTS_FILE
from engines.experimentation.experiments import ExperimentConfigError, load, parse
from orchestration.profiles import resources_for
from resources.registry import ModelRegistryResource
from tests.conftest import LAST_DAY

USERS = range(20_000)


def many(n: int) -> dict:
    return {
        "experiments": [
            {
                "name": f"exp_{i}",
                "model": f"model_{i}",  # one model each: experiments outside a layer must not share one
                "salt": f"salt-{i}",
                "variants": [
                    {"name": "control", "model_alias": "champion", "traffic": 0.7},
                    {"name": "treatment", "model_version": 1, "traffic": 0.3},
                ],
            }
            for i in range(n)
        ]
    }


def test_assignment_is_deterministic_split_by_traffic_and_independent_across_25_experiments():
    experiments = parse(many(25))
    assert len(experiments) == 25
    treated = []
    for experiment in experiments:
        first = [experiment.assign(u).name for u in USERS]
        assert first == [experiment.assign(u).name for u in USERS]  # the same unit, the same variant
        in_treatment = {u for u, v in zip(USERS, first) if v == "treatment"}
        assert abs(len(in_treatment) / len(USERS) - 0.3) < 0.02
        treated.append(in_treatment)
    # independent salts: being treated in one experiment says nothing about another
    for a, b in zip(treated, treated[1:]):
        assert abs(len(a & b) / len(a) - 0.3) < 0.03
    assert {experiments[1].assign(u).model_ref for u in USERS} == {"@champion", "v1"}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda e: e["variants"][0].update(traffic=0.6), "sums to"),
        (lambda e: e["variants"][1].update(model_alias="champion"), "exactly one of model_alias or model_version"),
        (lambda e: e.update(salt="salt-1"), "already used"),
        (lambda e: e.pop("salt"), "missing salt"),
        (lambda e: e.update(name="Bad Name"), "lower_snake_case"),
    ],
)
def test_bad_definitions_are_refused_with_the_problem_named(change, message):
    raw = many(2)
    change(raw["experiments"][0])
    with pytest.raises(ExperimentConfigError, match=message):
        parse(raw)


def test_the_shipped_experiments_file_loads():
    names = [e.name for e in load(EXPERIMENTS_FILE)]
    assert "personalization_challenger" in names


def test_offline_comparison_report_per_variant(trained, models_lake):
    _, _, registry_root = trained
    resources = {
        **resources_for("local", data_dir=str(models_lake)),
        "model_registry": ModelRegistryResource(root=str(registry_root)),
    }
    key = AssetKey(["experiments", "personalization_challenger"])
    result = materialize(
        all_assets,
        selection=[key],
        resources=resources,
        partition_key=LAST_DAY.isoformat(),
        instance=DagsterInstance.ephemeral(),
    )
    metadata = result.asset_materializations_for_node("experiments__personalization_challenger")[0].metadata
    rows = [r.data for r in metadata["comparison"].value.records]
    assert [r["variant"] for r in rows] == ["control", "treatment"]
    assert all(r["impressions"] > 0 and 0 < r["auc"] < 1 for r in rows)
    assert abs(rows[0]["assigned_users"] - rows[1]["assigned_users"]) < 0.3 * rows[0]["users"]
    assert rows[0]["users"] == rows[1]["users"]  # every variant scores the same held-out users
    paired = {r.data["metric"]: r.data for r in metadata["against_control"].value.records}
    assert set(paired) == {"auc", "recall@10", "ndcg@10"} and paired["auc"]["test"].startswith("DeLong")
    assert paired["auc"]["control"] == pytest.approx(rows[0]["auc"], abs=2e-4)  # DeLong rounds the same AUC
    assert paired["auc"]["value"] == pytest.approx(rows[1]["auc"], abs=2e-4)
    shown_better = paired["auc"]["better"] and all(r["not_worse"] for r in paired.values())
    assert metadata["leader"].value == ("treatment" if shown_better else "control")
