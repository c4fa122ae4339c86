"""Model selection of the personalization model (ml.epoch_selection; fast tier, no Ray): on simulated users
whose taste clusters are known, training set up to overfit (a large step, no weight decay) falls below the
untrained start (the taste-cluster mixture) on the validation day, and the selection keeps the start or a
better epoch, never a worse one; it stops after `patience` epochs without a gain."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from ml.epoch_selection import EpochSelection, ValidationSet, split_validation
from ml.personalization import (
    LABEL,
    Objective,
    PersonalizationModel,
    TrainConfig,
    TwoTower,
    build_spec,
    fit_selected,
    labelled,
    with_fixed_item_attributes,
)
from tests.models.test_cluster_taste import with_category_counts
from tests.models.test_taste_clusters import impressions

# overfits a few thousand rows: a large step, no weight decay, small batches, no ids hidden
OVERFITTING = TrainConfig(
    dim=16, hidden=64, epochs=6, learning_rate=0.05, weight_decay=0.0, batch_size=32, unseen_share=0.0
)


@pytest.fixture(scope="module")
def rows() -> pl.DataFrame:
    return with_fixed_item_attributes(labelled(with_category_counts(impressions(days=3)[0])))


def started(train: pl.DataFrame, validation: pl.DataFrame, config: TrainConfig):
    torch.manual_seed(config.seed)
    spec = build_spec(train, config)
    network = TwoTower(spec)
    network.set_prior(train)
    network.set_history_categories(train)
    return network, ValidationSet.of(spec, validation, train)


def test_the_validation_day_is_the_newest_days_rows_of_a_share_of_its_clicking_users(rows):
    train, validation = split_validation(rows, 0.3, seed=1)
    days = rows.get_column("event_timestamp").dt.date()
    newest = rows.filter(days == days.max())
    clicking = set(newest.filter(pl.col(LABEL) > 0).get_column("user_id").to_list())
    held = set(validation.get_column("user_id").to_list())
    assert held <= clicking and len(held) == int(len(clicking) * 0.3)
    assert validation.get_column("event_timestamp").dt.date().unique().to_list() == [days.max()]
    # every row of those users on that day, and nothing else, left training
    assert validation.height == newest.filter(pl.col("user_id").is_in(list(held))).height
    assert train.height + validation.height == rows.height
    assert train.join(validation, on=["user_id", "event_timestamp", "item_id"]).is_empty()
    assert split_validation(rows, 0.0, seed=1)[1].is_empty()


def test_selection_never_keeps_a_model_worse_on_validation_than_the_mixture_it_starts_from(rows):
    train, validation = split_validation(rows, 0.3, seed=1)
    network, checked = started(train, validation, OVERFITTING)
    assert checked is not None
    start = checked.score(network)
    untrained = PersonalizationModel(TwoTower(network.spec))
    untrained.network.load_state_dict(network.state_dict())
    selection = EpochSelection(network, checked, patience=OVERFITTING.epochs)  # no early stop: every epoch seen
    losses = fit_selected(Objective(network), train, selection)

    assert len(losses) == OVERFITTING.epochs and len(selection.scores) == OVERFITTING.epochs + 1
    assert selection.scores[0] == pytest.approx(start)
    # the case is one where training hurts: the overfit epochs fall below the start
    assert min(selection.scores[1:]) < start - 0.01, selection.scores
    network.load_state_dict(selection.best())
    kept = checked.score(network)
    assert kept == pytest.approx(max(selection.scores)) and kept >= start
    assert selection.scores[selection.best_epoch] == pytest.approx(kept)
    if selection.best_epoch == 0:  # the start itself: the mixture's scores, unchanged
        np.testing.assert_allclose(PersonalizationModel(network).score(validation), untrained.score(validation))


def test_training_stops_after_patience_epochs_without_a_gain(rows):
    train, validation = split_validation(rows, 0.3, seed=1)
    network, checked = started(train, validation, OVERFITTING)
    selection = EpochSelection(network, checked, patience=2)
    losses = fit_selected(Objective(network), train, selection)
    assert len(losses) == min(selection.best_epoch + 2, OVERFITTING.epochs), (selection.scores, len(losses))
    assert len(losses) < OVERFITTING.epochs  # it overfits from the first epochs on: it stops early
    assert max(selection.scores[selection.best_epoch + 1 :]) <= selection.scores[selection.best_epoch]
