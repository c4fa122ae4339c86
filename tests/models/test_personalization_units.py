"""The personalization model's parts on a small made-up frame (fast tier, no Ray): the popularity
prior, the negatives' features, unseen ids and log-scaled counts, each against a recomputation from
the rows themselves."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import torch

from ml.personalization import (
    HISTORY_ATTRIBUTE,
    ITEM_INPUTS,
    UNSEEN,
    PersonalizationModel,
    TrainConfig,
    TwoTower,
    _daily_catalogues,
    _negative_pool,
    _positive_rows,
    build_spec,
    labelled,
    with_fixed_item_attributes,
)

POPULAR = "item_popularity__clicks_7d"


def frame(rows: int = 400, seed: int = 5) -> pl.DataFrame:
    """Impressions over three days; an item's clicks_7d grows day by day (null on the first)."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    out = []
    for _ in range(rows):
        day, item = rng.randrange(3), rng.randrange(1, 30)
        out.append(
            {
                "user_id": rng.randrange(1, 50),
                "item_id": item,
                "event_timestamp": start + timedelta(days=day, seconds=rng.randrange(86_400)),
                "label_click": rng.random() < 0.2,
                "label_play": rng.random() < 0.05,
                POPULAR: None if day == 0 else item * 10 * day,
            }
        )
    return pl.DataFrame(out)


def test_the_prior_is_log_one_plus_each_items_positives():
    rows = labelled(frame())
    network = TwoTower(build_spec(rows, TrainConfig(dim=4, hidden=8, prior="positives")))
    network.set_prior(rows)
    positives: dict[int, int] = {}
    for item, click, play in rows.select("item_id", "label_click", "label_play").iter_rows():
        positives[item] = positives.get(item, 0) + int(click or play)
    for item in random.Random(1).sample(sorted(positives), 10):
        assert math.isclose(float(network.item_prior[item]), math.log1p(positives[item]), rel_tol=1e-6)
    assert float(network.item_prior[UNSEEN]) == 0.0


def test_the_category_share_prior_is_each_items_share_of_its_categorys_impressions():
    """log((1 + impressions) ** power / the sum of that over the item's category), the category the item's
    newest known one; an item without rows gets the mean over categories of an item shown never."""
    rng = random.Random(3)
    rows = labelled(frame()).with_columns(
        pl.Series(HISTORY_ATTRIBUTE, [rng.choice(["a", "b", "c", None]) for _ in range(400)])
    )
    config = TrainConfig(dim=8, hidden=8, prior="category_share", prior_power=1.3)
    network = TwoTower(build_spec(rows, config))
    network.set_prior(rows)
    shown: dict[int, int] = {}
    category: dict[int, tuple[datetime, str | None]] = {}
    for item, at, name in rows.select("item_id", "event_timestamp", HISTORY_ATTRIBUTE).iter_rows():
        shown[item] = shown.get(item, 0) + 1
        if name is not None and (item not in category or at > category[item][0]):
            category[item] = (at, name)
    of = {item: category.get(item, (None, None))[1] for item in shown}
    totals: dict[str | None, float] = {}
    for item, n in shown.items():
        totals[of[item]] = totals.get(of[item], 0.0) + (1 + n) ** 1.3
    for item, n in shown.items():
        expected = math.log((1 + n) ** 1.3 / totals[of[item]])
        assert math.isclose(float(network.item_prior[item]), expected, rel_tol=1e-5)
    unseen = float(np.mean([-math.log(t) for t in totals.values()]))
    assert math.isclose(float(network.item_prior[UNSEEN]), unseen, rel_tol=1e-5)


def test_an_untrained_network_scores_with_the_prior_and_the_taste_head_alone():
    """The learnt terms start at zero: before training, a (user, item) score is the item's prior (the taste
    head, without a mixture, adds 0), whatever the user."""
    rows = labelled(frame())
    network = TwoTower(build_spec(rows, TrainConfig(dim=4, hidden=8)))
    network.set_prior(rows)
    model = PersonalizationModel(network)
    scores = model.score(rows)
    ids = network.spec.item.buckets(rows.get_column("item_id").to_numpy())
    assert np.allclose(scores, network.item_prior.numpy()[ids], atol=1e-6)


def test_clicked_positives_train_on_the_clicked_rows_alone():
    labels = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0])
    assert _positive_rows(labels, "clicked").tolist() == [1, 3, 4]
    assert _positive_rows(labels, "shown").tolist() == [0, 1, 2, 3, 4]


def test_negatives_carry_their_days_features():
    """A negative drawn for a row is an item shown that day, with that day's (first) feature values."""
    rows = labelled(frame())
    spec = build_spec(rows, TrainConfig(dim=4, hidden=8))
    catalogue, first, size = _daily_catalogues(rows, spec.item)
    days = rows.get_column("event_timestamp").dt.date().to_list()
    column = spec.item.numeric.index(POPULAR)
    for row in random.Random(2).sample(range(rows.height), 20):
        shown = rows.filter(pl.col("event_timestamp").dt.date() == days[row]).sort("event_timestamp")
        expected = {}
        for item, value in shown.select("item_id", POPULAR).iter_rows():
            expected.setdefault(item, value)
        drawn = range(int(first[row]), int(first[row] + size[row]))
        assert len(drawn) == len(expected)
        for index in drawn:
            item = int(catalogue["ids"][index])
            raw = expected[item] or 0.0
            scaled = (math.log1p(raw) - spec.item.means[column]) / spec.item.stds[column]
            assert math.isclose(float(catalogue["numeric"][index, column]), scaled, rel_tol=1e-5, abs_tol=1e-5)


def test_counts_are_log_scaled_and_unseen_ids_share_one_bucket():
    rows = labelled(frame())
    spec = build_spec(rows, TrainConfig(dim=4, hidden=8))
    assert any(i.view == "item_popularity" and i.log_counts for i in ITEM_INPUTS)
    assert POPULAR in spec.item.log_numeric
    assert spec.item.buckets(np.array([3, spec.item.id_buckets, 10**9, -1])).tolist() == [3, UNSEEN, UNSEEN, UNSEEN]
    model = PersonalizationModel(TwoTower(spec))
    newcomers = pl.DataFrame({"item_id": [10**6, 10**6 + 1], POPULAR: [5, 5]})
    vectors = model.item_vectors(newcomers)  # two new items with equal features: one vector
    np.testing.assert_allclose(vectors[0], vectors[1], rtol=1e-6, atol=1e-6)  # BLAS rounds rows apart
    scores = model.user_vectors(rows.head(3)) @ model.item_vectors(rows.head(3)).T
    np.testing.assert_allclose(np.diag(scores), model.score(rows.head(3)), rtol=1e-5, atol=1e-5)


def test_a_column_constant_in_training_is_left_out():
    rows = labelled(frame()).with_columns(pl.lit(None, pl.Float64).alias("item_content__price"))
    spec = build_spec(rows, TrainConfig(dim=4, hidden=8))
    assert "item_content__price" not in spec.item.numeric and POPULAR in spec.item.numeric
    assert torch.isfinite(torch.tensor(spec.item.stds)).all()


def test_impression_negatives_are_the_days_impressions_drawn_as_often_as_shown():
    base = frame(rows=2000)
    # one item shown as often as all the others together: drawn uniformly it would be a rare negative
    rows = labelled(pl.concat([base, base.with_columns(pl.lit(3, pl.Int64).alias("item_id"))]))
    spec = build_spec(rows, TrainConfig(dim=4, hidden=8))
    inputs = spec.item.encode(rows)
    pool, first, size, pool_rows = _negative_pool(rows, spec.item, inputs, "impressions")
    days = rows.get_column("event_timestamp").dt.date().to_list()
    generator = torch.Generator().manual_seed(0)
    row = 7  # many draws for one row: every one a row of its day, items as often as that day shows them
    draws = pool_rows[first[row] + (torch.rand(20_000, generator=generator) * size[row]).long()].numpy()
    assert {days[d] for d in draws} == {days[row]}
    shown = rows.filter(pl.col("event_timestamp").dt.date() == days[row]).get_column("item_id").value_counts()
    drawn = pl.Series("item_id", rows.get_column("item_id").to_numpy()[draws]).value_counts(name="drawn")
    share = shown.join(drawn, on="item_id")
    expected = share.get_column("count") / share.get_column("count").sum()
    observed = share.get_column("drawn") / share.get_column("drawn").sum()
    assert float((expected - observed).abs().max()) < 0.01


def test_a_first_day_null_category_is_filled_from_the_items_first_known_one():
    rows = frame().with_columns(
        pl.when(pl.col("event_timestamp").dt.day() == 1)
        .then(None)
        .otherwise(pl.format("c{}", pl.col("item_id") % 3))
        .alias("item_content__category")
    )
    filled = with_fixed_item_attributes(rows)
    assert filled.select("user_id", "item_id", "event_timestamp").equals(
        rows.select("user_id", "item_id", "event_timestamp")
    )
    later = set(rows.drop_nulls("item_content__category").get_column("item_id").to_list())
    for item, category in filled.select("item_id", "item_content__category").iter_rows():
        assert category == (f"c{item % 3}" if item in later else None)
