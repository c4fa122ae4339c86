"""The recommendation_relevance release read back as (user, item, relevant) rows for the personalization
evaluation (engines/data/releases.py), and the hook that scores a model's agreement with those labels: checked
against the labels the simulated annotators were given and an AUC counted pair by pair."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import polars as pl
import pytest

from engines.data.releases import human_relevance_metrics, releases_dir, relevance_labels
from ground_truth import accounts, queue, review
from ground_truth import release as rel
from ground_truth.db import connect
from ground_truth.schema import RECOMMENDATION_RELEVANCE, ItemIn
from tests.ground_truth.conftest import make_accounts

TRUTH = {(user, item): (user + item) % 3 == 0 for user in range(1, 5) for item in range(10, 16)}


def release_truth(lake, truth: dict[tuple[int, int], bool]) -> None:
    """The relevance task labelled by careful annotators through the queue, then released."""
    engine = connect(f"sqlite:///{lake / 'labels.db'}")
    make_accounts(engine, 3)
    ids = [a.id for a in accounts.list_accounts(engine) if a.role.value == "annotator"]
    task = queue.create_task(engine, RECOMMENDATION_RELEVANCE)
    queue.add_items(engine, task, [ItemIn(key=f"{u}:{i}", queue="models", title=str(i)) for u, i in truth])
    for person in ids:
        while (item := queue.serve(engine, task, person)) is not None:
            user, item_id = map(int, item.key.split(":"))
            queue.answer(engine, task, person, item.item_id, "relevant" if truth[user, item_id] else "not_relevant")
    states = review.item_states(engine, task)
    found = rel.candidate(task, states, review.task_quality(engine, task, states))
    rel.write_release(lake, found, {})
    engine.dispose()


def test_released_relevance_labels_are_user_item_rows(tmp_path):
    assert relevance_labels(tmp_path) is None  # before the first release
    release_truth(tmp_path, TRUTH)
    labels = relevance_labels(tmp_path)
    assert labels.lineage == "recommendation_relevance/v0001"
    assert labels.rows.columns == ["user_id", "item_id", "relevant", "posterior"]
    assert {(u, i): r for u, i, r, _ in labels.rows.iter_rows()} == TRUTH
    assert (labels.rows["posterior"] >= RECOMMENDATION_RELEVANCE.confidence).all()
    assert relevance_labels(tmp_path, version=1).rows.equals(labels.rows)
    with pytest.raises(ValueError, match="no release v0002"):
        relevance_labels(tmp_path, version=2)


def test_a_malformed_release_is_refused_naming_the_row(tmp_path):
    folder = releases_dir(tmp_path, "recommendation_relevance") / "v0001"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({}))
    for key, label, problem in (("7-9", "relevant", "'7-9' is not"), ("7:9", "maybe", "label 'maybe'")):
        pl.DataFrame({"key": [key], "label": [label], "posterior": [0.99]}).write_parquet(folder / "labels.parquet")
        with pytest.raises(ValueError, match=problem):
            relevance_labels(tmp_path)


def test_the_evaluation_hook_scores_agreement_with_human_labels(tmp_path):
    release_truth(tmp_path, TRUTH)
    labels = relevance_labels(tmp_path)
    rng = random.Random(3)
    # the model's scored rows: some labelled pairs twice (two impressions), some pairs nobody labelled
    pairs = [*TRUTH, *list(TRUTH)[:5], (99, 10), (1, 99)]
    scores = [rng.random() for _ in pairs]
    scored = pl.DataFrame({"user_id": [u for u, _ in pairs], "item_id": [i for _, i in pairs]})
    found = human_relevance_metrics(scored, scores, labels)
    # recomputed here: each labelled pair at the mean of its scores; AUC counted over every relevant and
    # not-relevant pair, ties half
    mean = {p: np.mean([s for q, s in zip(pairs, scores) if q == p]) for p in TRUTH}
    yes, no = [mean[p] for p in TRUTH if TRUTH[p]], [mean[p] for p in TRUTH if not TRUTH[p]]
    wins = sum((a > b) + 0.5 * (a == b) for a, b in itertools.product(yes, no))
    assert found["release"] == "recommendation_relevance/v0001"
    assert found["pairs"] == len(TRUTH) and found["relevant"] == len(yes)
    assert found["auc"] == pytest.approx(wins / (len(yes) * len(no)))
    perfect = human_relevance_metrics(scored, [float(TRUTH.get(p, 0)) for p in pairs], labels)
    assert perfect["auc"] == 1.0
    one_kind = scored.filter(pl.col("user_id") == 99)
    assert human_relevance_metrics(one_kind, [0.5], labels) == {**found, "pairs": 0, "relevant": 0, "auc": None}
    with pytest.raises(ValueError, match="scores"):
        human_relevance_metrics(scored, scores[:-1], labels)
