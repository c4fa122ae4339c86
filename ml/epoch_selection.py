"""Model selection for the personalization model: training never leaves it worse than where it started.

The network starts as the taste-cluster mixture (ml.personalization, the learnt terms at zero). A share of
the users of the newest training day is held out of training (`split_validation`): their rows of that day
become a validation day on which each epoch's network ranks the training catalogue for each of those users,
scored by the mean of recall@k and NDCG@k against their positives of that day. `EpochSelection` keeps the
best state, the untrained start (epoch 0) included, and says when to stop: `patience` epochs without a gain.
The prior and the mixture are fitted on the training rows alone, so the start does not see the validation day.

Plain numpy, polars and torch, no Dagster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import torch

LABEL = "label"


def split_validation(frame: pl.DataFrame, share: float, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Labelled rows split into training rows and a validation day: the newest day's rows of a random
    `share` of that day's users with a positive. None split (all rows train) with fewer than two days,
    a share of 0, or no user chosen."""
    days = frame.get_column("event_timestamp").dt.date()
    newest = days.max()
    if share <= 0 or days.n_unique() < 2:
        return frame, frame.clear()
    on_newest = frame.filter(days == newest)
    users = sorted(on_newest.filter(pl.col(LABEL) > 0).get_column("user_id").unique().to_list())
    chosen = np.random.default_rng(seed).permutation(users)[: int(len(users) * share)].tolist()
    held = (days == newest) & pl.col("user_id").is_in(chosen)
    return frame.filter(~held), frame.filter(held)


@dataclass
class ValidationSet:
    """Encoded validation users (one row each), the candidate items, and each user's positive items."""

    users: dict[str, torch.Tensor]
    items: dict[str, torch.Tensor]
    item_ids: np.ndarray
    relevant: list[set[int]]
    k: int = 10

    @classmethod
    def of(cls, spec, validation: pl.DataFrame, train: pl.DataFrame, k: int = 10) -> ValidationSet | None:
        """From a ModelSpec, the validation rows and the training rows (the candidates: each item of them
        with its newest features); None without a validation user."""
        positives = validation.filter(pl.col(LABEL) > 0)
        if positives.is_empty():
            return None
        relevant = positives.group_by("user_id").agg(pl.col("item_id").unique()).sort("user_id")
        users = (
            validation.sort("event_timestamp")
            .unique("user_id", keep="first")
            .sort("user_id")
            .filter(pl.col("user_id").is_in(relevant.get_column("user_id").implode()))
        )
        items = train.sort("event_timestamp").unique("item_id", keep="last").sort("item_id")
        return cls(
            spec.user.encode(users.select(spec.user.columns)),
            spec.item.encode(items.select(spec.item.columns)),
            items.get_column("item_id").to_numpy(),
            [set(i) for i in relevant.get_column("item_id").to_list()],
            k,
        )

    @torch.no_grad()
    def score(self, network) -> float:
        """The mean of recall@k and NDCG@k of the network's ranking of the candidates, over the users."""
        training = network.training
        network.eval()
        scores = network.user_vectors(self.users) @ network.item_vectors(self.items).T
        network.train(training)
        top = self.item_ids[torch.topk(scores, min(self.k, scores.shape[1]), dim=1).indices.numpy()]
        recalls, ndcgs = [], []
        for ranked, relevant in zip(top, self.relevant):
            hits = [1.0 if int(i) in relevant else 0.0 for i in ranked]
            ideal = sum(1 / math.log2(r + 2) for r in range(min(len(relevant), self.k)))
            recalls.append(sum(hits) / len(relevant))
            ndcgs.append(sum(h / math.log2(r + 2) for r, h in enumerate(hits)) / ideal)
        return float((np.mean(recalls) + np.mean(ndcgs)) / 2)


class EpochSelection:
    """The best state of a network on a validation set across epochs, the start (epoch 0) included."""

    def __init__(self, network, validation: ValidationSet | None, patience: int, resumed: dict | None = None):
        self.network, self.validation, self.patience = network, validation, patience
        if resumed is not None:  # after a restart: the selection as checkpointed
            self.scores, self.best_epoch, self.best_state = resumed["scores"], resumed["epoch"], resumed["state"]
        else:
            self.scores = [self._score()]
            self.best_epoch, self.best_state = 0, self._copy()

    def _score(self) -> float:
        return self.validation.score(self.network) if self.validation is not None else math.nan

    def _copy(self) -> dict:
        return {k: v.detach().clone() for k, v in self.network.state_dict().items()}

    def after_epoch(self, epoch: int) -> bool:
        """Score the network after (0-based) `epoch`, keep it if best; whether to stop training. Without a
        validation set every epoch is kept (the last one wins) and training runs its course."""
        score = self._score()
        self.scores.append(score)
        if self.validation is None or score > self.scores[self.best_epoch]:
            self.best_epoch, self.best_state = epoch + 1, self._copy()
        return self.validation is not None and epoch + 1 - self.best_epoch >= self.patience

    def state(self) -> dict:
        """What a checkpoint keeps to resume the selection."""
        return {"scores": list(self.scores), "epoch": self.best_epoch, "state": self.best_state}

    def best(self) -> dict:
        """The selected epoch's weights."""
        return self.best_state
