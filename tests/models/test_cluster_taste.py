"""The model's taste inputs, its data report and the ranking gate (fast tier, no Ray).

- The taste-cluster mixture inside the user tower, read through a user's counts per category (the
  user_category_affinity view), finds the liked categories of simulated users whose clusters are known,
  and a newcomer's list (an id never trained) follows the categories of those counts.
- Fixed item attributes are filled from the item's first delivery, the rows still without features are
  counted, against a recomputation.
- The gate promotes only a version shown better on every ranking metric; a tie stays a challenger, and
  a tie with the strong baseline fails the baseline check.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from assets.pipelines import TrainedModel, offline_verdict
from ml.comparison import paired_bootstrap
from ml.personalization import (
    HISTORY_ATTRIBUTE,
    TASTE_VIEW,
    Objective,
    PersonalizationModel,
    TrainConfig,
    TwoTower,
    build_spec,
    feature_coverage,
    fit,
    labelled,
    with_fixed_item_attributes,
)
from tests.models.test_taste_clusters import CATEGORIES, impressions, world


def with_category_counts(rows: pl.DataFrame) -> pl.DataFrame:
    """Each row with its user's impressions and clicks per category over the days before its own (what the
    daily view holds as of the row), counted from the rows themselves; null before the user's first day."""
    day = pl.col("event_timestamp").dt.date().alias("_day")
    rows = rows.with_columns(day, pl.col(HISTORY_ATTRIBUTE).fill_null(strategy="forward").over("item_id"))
    names = [f"category{c}" for c in range(CATEGORIES)]
    daily = rows.group_by("user_id", "_day").agg(
        *[(pl.col(HISTORY_ATTRIBUTE) == n).sum().alias(f"i_{n}") for n in names],
        *[((pl.col(HISTORY_ATTRIBUTE) == n) & pl.col("label_click")).sum().alias(f"c_{n}") for n in names],
    )
    days = sorted(rows.get_column("_day").unique().to_list())
    before = []
    for d in days[1:]:
        seen = daily.filter(pl.col("_day") < d).group_by("user_id").agg(pl.exclude("_day").sum())
        before.append(seen.with_columns(pl.lit(d).alias("_day")))
    counts = pl.concat(before).rename(
        {
            **{f"i_{n}": f"{TASTE_VIEW}__impressions_30d_{n}" for n in names},
            **{f"c_{n}": f"{TASTE_VIEW}__clicks_30d_{n}" for n in names},
        }
    )
    return rows.join(counts, on=["user_id", "_day"], how="left").drop("_day")


def test_the_mixture_in_the_user_tower_finds_each_users_liked_categories():
    rows, cluster = impressions(days=4)
    train = labelled(with_category_counts(rows))
    torch.manual_seed(0)
    spec = build_spec(train, TrainConfig(dim=16, hidden=32, epochs=4))
    assert spec.user.taste_categories == CATEGORIES + 1 and len(spec.user.taste_prior) == 8
    network = TwoTower(spec)
    network.set_prior(train)
    fit(Objective(network), train)
    model = PersonalizationModel(network)

    _, affinity, category, _ = world()
    names = spec.item.categorical[HISTORY_ATTRIBUTE]
    # newcomers whose counts show 40 impressions of each liked category of their cluster, 3 clicks each
    newcomers = []
    for c in range(4):
        counts = {f"{TASTE_VIEW}__impressions_30d_{n}": 0 for n in names}
        counts |= {f"{TASTE_VIEW}__clicks_30d_{n}": 0 for n in names}
        for liked in (2 * c, 2 * c + 1):
            counts[f"{TASTE_VIEW}__impressions_30d_category{liked}"] = 40
            counts[f"{TASTE_VIEW}__clicks_30d_category{liked}"] = 3
        newcomers.append({"user_id": 100_000 + c, **counts})
    users = pl.DataFrame(newcomers)
    users = users.with_columns(*[pl.lit(None).alias(c) for c in spec.user.columns if c not in users.columns])
    with torch.no_grad():
        taste = network.user_tower.cluster_taste(spec.user.encode(users)["numeric"]).numpy()[:, 1:]
    for c in range(4):  # column 0 is the unknown category
        best = {names[k] for k in np.argsort(-taste[c])[:2]}
        assert best == {f"category{2 * c}", f"category{2 * c + 1}"}, (c, taste[c])

    items = train.drop_nulls(HISTORY_ATTRIBUTE).unique("item_id").sort("item_id")
    scores = model.user_vectors(users) @ model.item_vectors(items).T
    item_category = items.get_column(HISTORY_ATTRIBUTE).to_numpy()
    in_taste = [
        np.isin(item_category[np.argsort(-scores[c])[:10]], [f"category{2 * c}", f"category{2 * c + 1}"]).mean()
        for c in range(4)
    ]
    # a quarter by chance; the popularity prior keeps some of the most clicked items of other categories
    assert np.mean(in_taste) >= 0.6 and min(in_taste) >= 0.4, in_taste


def test_the_served_numpy_tower_computes_the_mixture_as_the_network_does():
    """Training/serving parity of the taste head: the model server's numpy user tower (serving/models/kinds/towers.py)
    against the torch network, on users with random counts (missing ones too) and random weights."""
    from serving.models.kinds.towers import TwoTowerModel

    rows, _ = impressions(days=3)
    train = labelled(with_category_counts(rows))
    network = TwoTower(build_spec(train, TrainConfig(dim=16, hidden=16)))
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            if name != "prior_weight":
                parameter.normal_(0.0, 0.3)
    served = TwoTowerModel(PersonalizationModel(network), None, "personalization_ranking")
    spec = network.spec.user
    rng = np.random.default_rng(0)
    columns: dict[str, list] = {"user_id": rng.integers(0, 400, 50).tolist()}
    for c in spec.numeric:
        columns[c] = [None if rng.random() < 0.2 else float(v) for v in rng.poisson(6, 50)]
    ours, torch_path = served.user_vectors(columns), served.torch_user_vectors(columns)
    assert ours.shape == (50, network.spec.vector_dim)
    np.testing.assert_allclose(ours, torch_path, rtol=1e-4, atol=1e-4)
    # the mixture's term moves the vectors: users with other counts get other taste values
    assert np.ptp(ours[:, -1 - spec.taste_categories : -1], axis=0).max() > 0.1


def test_fixed_item_attributes_are_filled_and_featureless_rows_counted():
    rows = pl.DataFrame(
        {
            "user_id": [1, 1, 2, 2, 3],
            "item_id": [10, 11, 10, 11, 12],
            "event_timestamp": pl.datetime_range(
                pl.datetime(2026, 1, 1, time_zone="UTC"), pl.datetime(2026, 1, 3, time_zone="UTC"), "12h", eager=True
            ),
            "item_content__category": [None, None, "pet", "hat", None],
            "item_content__price": [None, None, 2.0, 3.0, None],
            # item 11's mesh is broken: volume null by nature, while its view is not null
            "item_geometry__volume": [None, None, 1.5, None, None],
            "item_geometry__is_broken": [None, None, False, True, None],
            "user_engagement__clicks_7d": [None, 1, None, 2, None],
        }
    )
    filled = with_fixed_item_attributes(rows)
    assert filled.get_column("item_content__category").to_list() == ["pet", "hat", "pet", "hat", None]
    assert filled.get_column("item_content__price").to_list() == [2.0, 3.0, 2.0, 3.0, None]
    assert filled.get_column("item_geometry__volume").to_list() == [1.5, None, 1.5, None, None]
    assert filled.get_column("item_geometry__is_broken").to_list() == [False, True, False, True, None]
    assert feature_coverage(rows, filled) == {
        "rows": 5,
        "rows_without_user_features": 3,
        "rows_without_item_features": 3,
        "rows_without_item_features_after_filling": 1,
    }


def _ranking_comparisons(gain: float, seed: int) -> dict:
    """Per-user recall and NDCG of a champion and a challenger that is `gain` better on average."""
    rng = np.random.default_rng(seed)
    users = np.arange(400)
    base = rng.uniform(0.3, 0.8, (2, len(users)))
    noise = rng.normal(0, 0.1, (2, len(users)))
    return {
        metric: paired_bootstrap(base[i], np.clip(base[i] + gain + noise[i], 0, 1), users=users, seed=seed)
        for i, metric in enumerate(("model_recall_at_10", "model_ndcg_at_10"))
    }


def test_a_version_is_promoted_only_when_shown_better_on_every_ranking_metric():
    primaries = ("model_recall_at_10", "model_ndcg_at_10")
    gain = _ranking_comparisons(0.05, seed=1)
    assert offline_verdict(gain, primaries, margin=0.01).passed
    tie = _ranking_comparisons(0.0, seed=2)
    verdict = offline_verdict(tie, primaries, margin=0.05)
    assert not verdict.passed and "stays a challenger" in verdict.reason
    half = {"model_recall_at_10": gain["model_recall_at_10"], "model_ndcg_at_10": tie["model_ndcg_at_10"]}
    verdict = offline_verdict(half, primaries, margin=0.05)
    assert not verdict.passed and "model_ndcg_at_10 not shown better" in verdict.reason


def test_the_baseline_check_refuses_a_tie_with_the_strong_baseline(tmp_path):
    from assets.pipelines import baseline_check

    def trained(comparisons: dict, gated: bool = True) -> TrainedModel:
        return TrainedModel(
            tmp_path,
            {"model_auc": 0.7},
            "model_auc",
            lambda _: {},
            [],
            "s",
            baseline={"model_auc": 0.6},
            baseline_comparisons=comparisons,
            gate_on_comparisons=gated,
        )

    assert trained(_ranking_comparisons(0.05, seed=3)).short_of_baseline() == {}
    tie = _ranking_comparisons(0.0, seed=4)
    assert set(trained(tie).short_of_baseline()) == {"model_recall_at_10 (paired)", "model_ndcg_at_10 (paired)"}
    # reported, not gated: the check passes on the popularity figure and still shows the paired comparison
    check = baseline_check(trained(tie, gated=False))
    assert check.passed and "paired bootstrap over 400 users" in check.metadata["comparison"].value


def test_the_softmax_loss_corrects_each_logit_by_its_chance_of_being_drawn():
    from ml.personalization import _corrected_softmax_loss

    shown, drawn = torch.tensor([2.0, 0.5]), torch.tensor([1.0, 0.0, 1.5, 0.2])  # two negatives per row
    weight = torch.tensor([1.0, 3.0])
    flat = torch.zeros(2), torch.zeros(4)
    logits = torch.tensor([[2.0, 1.0, 1.5], [0.5, 0.0, 0.2]])
    plain = torch.nn.functional.cross_entropy(logits, torch.zeros(2, dtype=torch.long), reduction="none")
    assert torch.isclose(_corrected_softmax_loss(shown, drawn, *flat, weight), (plain * weight).sum() / 4)
    # a negative drawn more often (a popular item) is discounted: the loss of telling it apart falls
    often = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5])), torch.log(torch.tensor([0.9, 0.5, 0.5, 0.5]))
    assert _corrected_softmax_loss(shown, drawn, often[0][:2], often[1], weight) < _corrected_softmax_loss(
        shown, drawn, often[0][:2], often[0], weight
    )
