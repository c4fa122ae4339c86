"""The personalization evaluation against human relevance labels (ml/evaluation.py): a release whose labels
come from the simulator's truth (a user's taste cluster likes the item's category more than most), released
through the labeling queue; the metric recomputed pair by pair from the raw rows; a scorer that knows the
truth agrees with the humans better than a random one; before the first release the metrics say so; the
release is in the model's lineage (the asset graph)."""

from __future__ import annotations

import itertools
import random
import shutil
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
import torch

from assets.datasets import DATASETS_ZONE, TRAINING_SET
from assets.models import PUBLISHED_RELEVANCE_RELEASE, human_relevance_metadata, train_personalization
from engines.data.lake import Lake
from engines.data.releases import NO_RELEASE, RELEASES_TAG, relevance_labels
from engines.models import human_relevance
from engines.models.registry import ModelRegistry
from ml import evaluation
from ml.personalization import PersonalizationModel, TrainConfig, TwoTower, build_spec, labelled
from simulator.answer_key import AnswerKey
from tests.conftest import LAST_DAY, SMALL
from tests.ground_truth.test_relevance_release import release_truth
from tests.models.conftest import train
from tests.untrained import with_drawn_outputs

POPULAR, ENGAGED = "item_popularity__clicks_7d", "user_engagement__clicks_7d"


def taste_truth(key: AnswerKey, users: list[int], items: list[int]) -> dict[tuple[int, int], bool]:
    """Relevant: the user's taste cluster likes the item's category more than the median category."""
    medians = np.median(key.log_affinity, axis=1)
    return {
        (u, i): bool(key.log_affinity[key.cluster[u], key.category[i]] > medians[key.cluster[u]])
        for u, i in itertools.product(users, items)
    }


def simulated(seed: int = 4) -> tuple[AnswerKey, list[int], list[int]]:
    key = AnswerKey.on(SMALL, LAST_DAY)  # the simulated world's truth, no lake needed
    rng = random.Random(seed)
    return key, sorted(rng.sample(sorted(key.cluster), 30)), sorted(rng.sample(sorted(key.category), 12))


def impressions(users: list[int], items: list[int], seed: int = 5) -> pl.DataFrame:
    """Three days of impressions of `items` to `users`; both features change day by day."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for day, user, item in itertools.product(range(3), users, items):
        if rng.random() < 0.4:
            rows.append(
                {
                    "user_id": user,
                    "item_id": item,
                    "event_timestamp": start + timedelta(days=day, seconds=rng.randrange(86_400)),
                    "label_click": rng.random() < 0.2,
                    "label_play": False,
                    ENGAGED: rng.randrange(50) * (day + 1),
                    POPULAR: None if day == 0 else rng.randrange(1, 100) * day,
                }
            )
    return pl.DataFrame(rows, infer_schema_length=None)


def drawn_model(frame: pl.DataFrame) -> PersonalizationModel:
    torch.manual_seed(2)
    network = TwoTower(build_spec(labelled(frame), TrainConfig(dim=4, hidden=8)))
    network.set_prior(labelled(frame))
    return PersonalizationModel(with_drawn_outputs(network))


def test_the_human_relevance_auc_is_recomputed_pair_by_pair_from_the_raw_rows(tmp_path):
    key, users, items = simulated()
    frame = impressions(users, items)
    labelled_users = sorted(random.Random(6).sample(users, 10))
    truth = taste_truth(key, labelled_users, items)
    stranger = max(key.cluster) + 1  # labelled, but not in the model's rows: left out
    release_truth(tmp_path, {**truth, (stranger, items[0]): True})
    labels = relevance_labels(tmp_path)
    model = drawn_model(frame)
    train, held_out = evaluation.split_held_out(frame)
    found = human_relevance.model_human_relevance(model, train, held_out, labels)["model"]

    newest = frame.sort("event_timestamp")  # recomputed here: each pair from its user's and item's last rows

    def score(user: int, item: int) -> float:
        user_row = newest.filter(pl.col("user_id") == user).row(-1, named=True)
        item_row = newest.filter(pl.col("item_id") == item).row(-1, named=True)
        row = {**item_row, "user_id": user, ENGAGED: user_row[ENGAGED]}
        return float(model.score(pl.DataFrame([row], schema=frame.schema))[0])

    scores = {pair: score(*pair) for pair in truth}
    yes, no = [scores[p] for p in truth if truth[p]], [scores[p] for p in truth if not truth[p]]
    wins = sum((a > b) + 0.5 * (a == b) for a, b in itertools.product(yes, no))
    assert yes and no
    assert found["release"] == "recommendation_relevance/v0001" and found["labelled"] == len(truth) + 1
    assert found["pairs"] == len(truth) and found["relevant"] == len(yes)
    assert found["auc"] == pytest.approx(wins / (len(yes) * len(no)), abs=1e-9)


def test_a_scorer_that_knows_the_users_tastes_agrees_with_the_humans_better_than_chance(tmp_path):
    key, users, items = simulated(seed=8)
    truth = taste_truth(key, users, items)
    release_truth(tmp_path, truth)
    labels = relevance_labels(tmp_path)
    rows = human_relevance.labelled_pair_rows(impressions(users, items), labels.rows, ["user_id"], ["item_id"])
    rng = np.random.default_rng(3)

    def knows_the_truth(frame: pl.DataFrame) -> np.ndarray:  # the simulator's click model
        return np.array([key.click_logit(u, i) for u, i in frame.select("user_id", "item_id").iter_rows()])

    found = human_relevance.human_relevance(
        {"truth": knows_the_truth, "random": lambda frame: rng.random(frame.height)}, rows, labels
    )
    assert found["truth"]["pairs"] == found["random"]["pairs"] == rows.height > 100
    assert found["truth"]["auc"] > 0.75 and abs(found["random"]["auc"] - 0.5) < 0.2
    assert found["truth"]["auc"] > found["random"]["auc"]


def test_before_the_first_release_the_metrics_say_no_release(tmp_path):
    _, users, items = simulated()
    frame = impressions(users, items)
    train, held_out = evaluation.split_held_out(frame)
    found = human_relevance.model_human_relevance(drawn_model(frame), train, held_out, relevance_labels(tmp_path))
    assert set(found) == {"model", "popularity"}
    assert all(m["auc"] == m["release"] == NO_RELEASE and m["pairs"] == 0 for m in found.values())
    shown = human_relevance_metadata(found)
    assert shown["human_relevance_release"] == shown["human_relevance_auc"] == NO_RELEASE


def test_the_model_declares_the_relevance_release_in_its_lineage():
    from orchestration.definitions import defs

    graph = defs.resolve_asset_graph()
    model_key = train_personalization.assets[0].key
    assert PUBLISHED_RELEVANCE_RELEASE in graph.get(model_key).parent_keys
    assert graph.get(PUBLISHED_RELEVANCE_RELEASE).is_observable


def test_a_trained_version_records_the_release_its_evaluation_read(models_lake, ray_compute, tmp_path):
    """End to end: a release labelling pairs of the simulated days' users and items from the simulator's
    truth, then the training pipeline: its metadata scores every labelled pair and the registered version
    names the release."""
    lake = shutil.copytree(models_lake, tmp_path / "lake")
    rows = Lake(lake).read_partition(DATASETS_ZONE, TRAINING_SET, LAST_DAY)
    key, rng = AnswerKey.on(SMALL, LAST_DAY), random.Random(7)
    users = sorted(rng.sample(sorted(set(rows["user_id"].to_list()) & set(key.cluster)), 8))
    items = sorted(rng.sample(sorted(set(rows["item_id"].to_list()) & set(key.category)), 8))
    truth = taste_truth(key, users, items)
    release_truth(lake, truth)
    result = train(lake, ray_compute, tmp_path / "registry", raise_on_error=False)
    shown = result.asset_materializations_for_node("models__personalization")[0].metadata
    assert shown["human_relevance_release"].value == "recommendation_relevance/v0001"
    assert shown["human_relevance_pairs"].value == len(truth)  # each labelled user and item is in the rows
    version = ModelRegistry.local(tmp_path / "registry").get("personalization", "1")
    assert version.tags[RELEASES_TAG] == "recommendation_relevance/v0001"
    assert version.metrics["model_human_auc"] == pytest.approx(shown["human_relevance_auc"].value, abs=1e-4)
