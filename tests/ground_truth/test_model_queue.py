"""The recommendation_relevance queue with two real registered models: personalization v1 (champion) and v2
(challenger), built by the model code from the shared pipeline's training set with different random
weights (the queue needs two models that disagree, not good ones), in a real MLflow registry. The queued
pairs are checked against a recomputation from the raw training-set files: each pair's click probability
under each model from the towers' dot product (not the model's own scoring call), the first row of a pair
per day, the day's `top` largest gaps, the union over days (a pair is queued once)."""

from __future__ import annotations

import shutil
from datetime import timedelta

import numpy as np
import polars as pl
import pytest
import torch
from dagster import AssetKey, AssetSelection, DagsterInstance, materialize
from sqlalchemy import select

from assets import all_assets
from assets.datasets import DATASETS_ZONE, TRAINING_SET
from engines.models.registry import ModelRegistry
from ground_truth import queue
from ground_truth.db import item_sources, items
from ml.personalization import PersonalizationModel, TrainConfig, TwoTower, build_spec
from orchestration.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from orchestration.profiles import resources_for
from tests.conftest import DAYS, FIRST_DAY, LAST_DAY
from tests.untrained import with_drawn_outputs

QUEUE = AssetSelection.assets(["ground_truth", "recommendation_relevance", "queue"])
TOP = 15


@pytest.fixture(scope="module")
def lake(pipeline_dir, tmp_path_factory):
    """The pipeline's warehouse, thumbnails and training sets in a lake of our own, its registry holding
    two versions of `personalization`."""
    data_dir = tmp_path_factory.mktemp("model_queue_lake")
    for folder in ("warehouse", "landing/thumbnails", f"{DATASETS_ZONE}/{TRAINING_SET}"):
        shutil.copytree(pipeline_dir / folder, data_dir / folder)
    files = sorted((data_dir / DATASETS_ZONE / TRAINING_SET).rglob("*.parquet"))
    frame = pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")
    registry = ModelRegistry.local(data_dir / "registry")
    for seed, alias in ((1, "champion"), (2, "challenger")):
        torch.manual_seed(seed)
        network = TwoTower(build_spec(frame, TrainConfig(dim=8, hidden=32, taste=False)))
        model = PersonalizationModel(with_drawn_outputs(network))
        version = registry.register(
            "personalization",
            model.save(data_dir / f"model-{seed}"),
            {"mlplane.feature_service": "personalization_ranking"},
            {"model_auc": 0.5},
        )
        registry.set_alias("personalization", alias, version.version, who="test", reason="fixture")
    return data_dir


def run(data_dir):
    return materialize(
        all_assets,
        selection=QUEUE,
        resources=resources_for("local", data_dir=str(data_dir)),
        instance=DagsterInstance.ephemeral(),
        run_config={"ops": {"ground_truth__recommendation_relevance__queue": {"config": {"top": TOP}}}},
        tags={
            ASSET_PARTITION_RANGE_START_TAG: FIRST_DAY.isoformat(),
            ASSET_PARTITION_RANGE_END_TAG: LAST_DAY.isoformat(),
        },
    )


def expected_pairs(data_dir) -> dict[str, tuple[float, float]]:
    """key "user:item" -> (gap, champion probability) of the day it is first queued, recomputed from the raw
    training-set files and the registry's two versions."""
    registry = ModelRegistry.local(data_dir / "registry")
    models = {
        alias: PersonalizationModel.load(
            registry.load(
                "personalization", registry.by_alias("personalization", alias).version, data_dir / "check" / alias
            )
        )
        for alias in ("champion", "challenger")
    }
    catalogue = set(pl.read_parquet(data_dir / "warehouse" / "items" / "*" / "*.parquet")["item_id"].to_list())
    found: dict[str, tuple[float, float]] = {}
    for d in range(DAYS):
        day = FIRST_DAY + timedelta(days=d)
        files = sorted((data_dir / DATASETS_ZONE / TRAINING_SET).glob(f"*{day.isoformat()}*/*.parquet"))
        rows = pl.concat([pl.read_parquet(f) for f in files])
        first = {}
        for i, (user, item) in enumerate(zip(rows["user_id"].to_list(), rows["item_id"].to_list())):
            first.setdefault((user, item), i)
        rows = rows[sorted(first.values())]
        probability = {}
        for alias, model in models.items():  # the two-tower score: user vector . item vector
            logits = np.einsum("nd,nd->n", model.user_vectors(rows), model.item_vectors(rows))
            probability[alias] = 1 / (1 + np.exp(-logits.astype(np.float64)))
        gaps = np.abs(probability["champion"] - probability["challenger"])
        for i in np.argsort(-gaps)[:TOP]:
            key = f"{rows['user_id'][int(i)]}:{rows['item_id'][int(i)]}"
            if rows["item_id"][int(i)] in catalogue:
                found.setdefault(key, (float(gaps[i]), float(probability["champion"][i])))
    return found


def test_queue_holds_the_pairs_the_two_registered_models_disagree_on_most(lake):
    result = run(lake)
    assert result.success
    meta = next(
        e.materialization
        for e in result.get_asset_materialization_events()
        if e.asset_key == AssetKey(["ground_truth", "recommendation_relevance", "queue"])
    ).metadata
    assert (meta["champion"].value, meta["challenger"].value) == ("1", "2")
    engine = resources_for("local", data_dir=str(lake))["labels"].get_client()
    task = queue.get_task(engine, "recommendation_relevance")
    with engine.connect() as conn:
        queued = {
            r.key: r
            for r in conn.execute(
                select(items.c.key, items.c.priority, items.c.model_score, item_sources.c.queue)
                .join(item_sources, item_sources.c.item_id == items.c.id)
                .where(items.c.task_id == task.id)
            )
        }
    expected = expected_pairs(lake)
    assert len(expected) > TOP  # the days' top pairs are not all the same pairs
    assert set(queued) == set(expected)
    for key, (gap, champion) in expected.items():
        assert queued[key].queue == "model_disagreement"
        assert queued[key].priority == pytest.approx(gap, abs=1e-5)
        assert queued[key].model_score == pytest.approx(champion, abs=1e-4)  # shown rounded to 4 places
    assert meta["filled"].value == len(expected)
    again = run(lake)  # idempotent: nothing new on a re-run
    assert next(e.materialization for e in again.get_asset_materialization_events()).metadata["filled"].value == 0
