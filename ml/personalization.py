"""The personalization model: a two-tower retrieval model in torch whose dot product also ranks.

The user tower sees the user's id and the user-side features of the `personalization_ranking`
feature service, the item tower the item's id, its item-side features and, where present, its CLIP
embedding (`USER_INPUTS`, `ITEM_INPUTS`: one line per feature view). A history of item ids (the
last clicked items) enters twice: the mean of its items' id vectors, and the share of each item
category among its items (`HISTORY_ATTRIBUTE`, each item's category looked up in a table the model
saves), which states the user's taste in the terms of the item tower's category input. Both towers
end in vectors of the same size, so the item vectors go into the vector database and a user vector
retrieves its candidates there; the same dot product is the ranking score.

What a user clicks is `P(shown) x P(click | shown)`: the feed shows popular items and items of
the user's taste far more often, and most clicks land on them. The score is the log of the user's
expected positives on the item, built as the taste-cluster mixture's (ml.taste_clusters, the strong
baseline) is: the taste head holds the user's expected positives per impression of each category (the
mixture's posterior from the user's counts per category), the item's bias its share of its category's
positives, estimated from its impressions (`prior="category_share"`: twenty times as many as its clicks,
and the feed shows an item as often as it is popular). The learnt terms start at zero, so an untrained
network scores as the mixture does, and learn what the rows add: the clicked or played impressions
(`positives="clicked"`) told apart from impressions of the same day drawn at random
(`negatives_from="impressions"`), with strong weight decay (a few hundred clicks a day). Training on every
impression instead (`positives="shown"`, clicked ones weighted `click_weight` times) learns the feed's
exposure a second time, and a lower ranking (docs/benchmarks.md, "Model quality").

Training never leaves the model worse than its start on held-out users: a share of the newest training day's
users is a validation day, and the best epoch there, the untrained start (the mixture) included, is the one
kept (ml.epoch_selection).

Training runs on Ray Train (`TorchTrainer`): data-parallel, each worker takes its shard of the rows;
with no workers (`num_workers=0`), in the calling process (ml/ray_train.py).
Plain Python, no Dagster.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn

from ml import taste_clusters
from ml.epoch_selection import EpochSelection, ValidationSet, split_validation
from ml.ray_train import RANK_FILE, EpochCheckpoints, fitted, node_id


@dataclass(frozen=True)
class TowerInput:
    """One feature view a tower reads: every `<view>__<feature>` column of it in the training set.
    `log_counts`: its numbers are heavy-tailed counts, read as log(1 + x) before standardizing (a
    count that doubles moves the input by the same step at 10 as at 1,000)."""

    view: str
    log_counts: bool = False


# user_category_affinity: the shares of each category among what the user was shown and clicked, the
# user's taste in the item tower's terms (its per-category counts span orders of magnitude: log scale)
USER_INPUTS = (
    TowerInput("user_profile"),
    TowerInput("user_engagement"),
    TowerInput("user_category_affinity", log_counts=True),
)
# Daily views only: the item vectors are computed once per day (batch inference, the model server).
# item_popularity is the popularity prior as of the row's time (the last complete day's counts);
# its windows fill up over the first week, which the log scale keeps to a shift.
# item_geometry: counts, areas and volumes of the item's mesh span orders of magnitude, hence log scale.
ITEM_INPUTS = (
    TowerInput("item_content"),
    TowerInput("item_popularity", log_counts=True),
    TowerInput("item_geometry", log_counts=True),
)
# The item attribute a user's history is pooled through: the shares of each category among the items
# of a history say the user's taste, where the mean of the items' id vectors learns it from few clicks.
HISTORY_ATTRIBUTE = "item_content__category"
# The user's counts per item category the taste-cluster mixture reads: `<view>__<event>_<window>_<category>`
TASTE_VIEW, TASTE_WINDOW = "user_category_affinity", "30d"
LABEL = "label"
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"  # in a training checkpoint, beside the weights
SELECTION_FILE = "selection.pt"  # the best epoch's weights so far and the validation scores (ml.epoch_selection)
SPEC_FILE = "model.json"
UNSEEN = 0  # the id bucket of an id outside the trained range (ids start at 1): a new user or item


@dataclass
class TrainConfig:
    dim: int = 24  # each vector is dim + 1 long (the item's bias meets the user's constant 1)
    hidden: int = 64
    epochs: int = 20
    batch_size: int = 64  # of the positive rows (a few hundred a day)
    learning_rate: float = 0.01
    weight_decay: float = 1.0  # strong: the learnt terms add to the mixture's score only what the rows show
    seed: int = 0
    # items drawn per impression from `negatives_from`, told apart from the shown one
    negatives: int = 4
    # weight of a clicked or played impression against a plain one among the shown pairs: the learnt term
    # then leans from what the feed shows toward what is clicked of it
    click_weight: float = 4.0
    # where the negatives come from: "catalogue", items drawn uniformly from the day's catalogue (the
    # learnt term then learns exposure, popularity included); "impressions", the day's impressions
    # (popular items drawn as often as they are shown: the term learns what the user is shown beyond
    # what everyone is, and the prior adds popularity)
    negatives_from: str = "impressions"
    # the pairs told apart from the drawn negatives: "shown", every impression (clicked ones weighted
    # `click_weight`); "clicked", the clicked or played impressions alone
    positives: str = "clicked"
    # "softmax": each shown pair against its drawn negatives in one softmax whose logits are log-Q corrected
    # (less the log of each item's share of the day's impressions, the chance it is drawn), the prior inside
    # the logit: the score then estimates log P(item | user) over the whole catalogue, clicked impressions
    # counting `click_weight` times. "binary": shown against drawn in a logistic loss, prior added after (the
    # learnt term must then cancel each category's share of the drawn impressions, which the mixture's term
    # holds, and the served score keeps that cancel). "binary_log_q": the logistic loss with the prior inside the
    # logits, log-Q corrected as the softmax's: an untrained network (the mixture) starts near its optimum
    loss: str = "binary"
    # the item's popularity prior (item_prior): "positives", log(1 + its positives in the training rows), or
    # "category_share", the log of its share of its category's positives estimated from its impressions
    prior: str = "category_share"
    prior_power: float = 1.2
    # share of training ids replaced by the unseen bucket, so that new users and items get a learnt
    # vector (the average newcomer) rather than an untrained one
    unseen_share: float = 0.05
    # a taste head: `taste_categories` of each vector's `dim` values are the user's score per item category
    # (a linear map of the user tower's inputs) and the item's one-hot category, so that the dot product holds
    # a user-by-category term learnt from every impression rather than through the hidden layers
    taste: bool = True
    # model selection (ml.epoch_selection): the share of the newest training day's users with a positive held
    # out as a validation day, and the epochs without a gain on it before training stops; the best epoch is
    # kept, the untrained start (the mixture) included. 0: no validation, the last epoch is kept
    validation_share: float = 0.2
    patience: int = 4
    num_workers: int = 1  # 0: Ray Train's local mode, in this process (ml/ray_train.py)
    use_gpu: bool = False
    cpus_per_worker: int = 1  # reserved on Ray and run as torch threads


@dataclass
class TowerSpec:
    """What one tower reads: its id column, numeric and categorical columns with their statistics."""

    id_column: str
    id_buckets: int
    numeric: list[str]
    means: list[float]
    stds: list[float]
    categorical: dict[str, list[str]]  # column -> known values; index 0 is "unknown"
    histories: list[str] = field(default_factory=list)  # lists of item ids (last clicked, last played)
    embedding_column: str | None = None
    embedding_dim: int = 0
    log_numeric: list[str] = field(default_factory=list)  # numeric columns read as log(1 + x)
    # the values of HISTORY_ATTRIBUTE a history's items are counted by (index + 1; 0: unknown)
    history_categories: list[str] = field(default_factory=list)
    # user tower: the length of its taste head, one score per value of the item's HISTORY_ATTRIBUTE (0:
    # unknown) that meets the item's one-hot category in the dot product; 0 without one
    taste_categories: int = 0
    # user tower: the taste-cluster mixture (ml.taste_clusters) fitted on the training rows, read through a
    # user's counts per category of TASTE_VIEW: a user's expected positives per category under the
    # posterior over the clusters (the strong baseline's user term), the taste head's starting point
    taste_impressions: list[str] = field(default_factory=list)  # one column per category, the item's order
    taste_clicks: list[str] = field(default_factory=list)
    taste_prior: list[float] = field(default_factory=list)  # (clusters,)
    taste_exposure: list[list[float]] = field(default_factory=list)  # (clusters, categories)
    taste_propensity: list[list[float]] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        embedding = [self.embedding_column] if self.embedding_column else []
        return [self.id_column, *self.numeric, *self.categorical, *self.histories, *embedding]

    def buckets(self, ids: np.ndarray) -> np.ndarray:
        """Id embedding rows: the id itself inside the trained range, UNSEEN outside it."""
        ids = np.asarray(ids, dtype=np.int64)
        return np.where((ids > 0) & (ids < self.id_buckets), ids, UNSEEN)

    def scale(self, column: str, values: np.ndarray) -> np.ndarray:
        """A numeric column's raw values (nulls as 0) as the tower reads them, before standardizing."""
        return np.log1p(np.maximum(values, 0.0)) if column in self.log_numeric else values

    def encode(self, frame: pl.DataFrame) -> dict[str, torch.Tensor]:
        """Model inputs from a frame with this tower's columns (missing numeric values count as 0)."""
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise ValueError(f"{self.id_column} tower: input lacks columns {missing}")
        ids = self.buckets(frame.get_column(self.id_column).cast(pl.Int64).to_numpy())
        numeric = np.zeros((frame.height, len(self.numeric)), dtype=np.float32)
        for i, column in enumerate(self.numeric):
            values = frame.get_column(column).cast(pl.Float64).fill_null(0.0).fill_nan(0.0).to_numpy()
            numeric[:, i] = (self.scale(column, values) - self.means[i]) / self.stds[i]
        categorical = np.zeros((frame.height, len(self.categorical)), dtype=np.int64)
        for i, (column, values) in enumerate(self.categorical.items()):
            index = {v: k + 1 for k, v in enumerate(values)}
            categorical[:, i] = [index.get(v, 0) for v in frame.get_column(column).cast(pl.String).to_list()]
        inputs = {
            "ids": torch.from_numpy(ids),
            "numeric": torch.from_numpy(numeric),
            "categorical": torch.from_numpy(categorical),
        }
        for i, column in enumerate(self.histories):
            inputs[f"history{i}"] = torch.from_numpy(_padded_ids(frame.get_column(column)))
        if self.embedding_column:
            inputs["embedding"] = torch.from_numpy(_embedding_matrix(frame, self.embedding_column, self.embedding_dim))
        return inputs


@dataclass
class ModelSpec:
    user: TowerSpec
    item: TowerSpec
    config: TrainConfig = field(default_factory=TrainConfig)

    @property
    def vector_dim(self) -> int:
        """Length of a user or item vector (the vector database's dimension, less its padding)."""
        return self.config.dim + 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        raw = json.loads(text)
        return cls(user=TowerSpec(**raw["user"]), item=TowerSpec(**raw["item"]), config=TrainConfig(**raw["config"]))


class Tower(nn.Module):
    def __init__(
        self, spec: TowerSpec, hidden: int, outputs: int, item_ids: nn.Embedding | None = None, id_dim: int = 16
    ):
        super().__init__()
        self.ids = nn.Embedding(spec.id_buckets, id_dim)
        self.categories = nn.ModuleList(nn.Embedding(len(v) + 1, 8) for v in spec.categorical.values())
        self.item_ids = item_ids  # shared with the item tower: a history is the mean of its items
        self.histories = len(spec.histories)
        self.categories_of_history = (
            len(spec.history_categories) + 1 if spec.history_categories and item_ids is not None else 0
        )
        if self.categories_of_history:
            # item id bucket -> its category's index (0: unknown); filled by TwoTower.set_history_categories
            self.register_buffer("item_category", torch.zeros(item_ids.num_embeddings, dtype=torch.long))
        per_history = id_dim + self.categories_of_history
        width = (
            id_dim + len(spec.numeric) + 8 * len(spec.categorical) + spec.embedding_dim + per_history * self.histories
        )
        self.mixture = bool(spec.taste_prior)
        if self.mixture:
            self._register_mixture(spec)
        width += spec.taste_categories if self.mixture else 0
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, outputs))
        self.taste = nn.Linear(width, spec.taste_categories) if spec.taste_categories else None
        # the mixture's weight, 1 + this (weight decay pulls the learnt terms toward the mixture's score)
        self.cluster_weight = nn.Parameter(torch.zeros(1))
        # each id's own output vector next to the features' (a matrix factorization term): who was
        # shown what is learnt per user and item directly, not only through the hidden layer
        self.direct = nn.Embedding(spec.id_buckets, outputs)
        nn.init.zeros_(self.direct.weight)

    def _register_mixture(self, spec: TowerSpec) -> None:
        """The mixture's parameters and where its counts sit among the numeric inputs (-1: a column left out
        of them, constant in training, read as 0), with their scaling, so that the tower computes the
        mixture's term from its ordinary inputs (the exported and served towers take no other)."""
        columns = [*spec.taste_impressions, *spec.taste_clicks]
        position = [spec.numeric.index(c) if c in spec.numeric else -1 for c in columns]
        at = [max(p, 0) for p in position]
        self.register_buffer("taste_position", torch.tensor(position, dtype=torch.long))
        self.register_buffer("taste_mean", torch.tensor([spec.means[p] for p in at], dtype=torch.float32))
        self.register_buffer("taste_std", torch.tensor([spec.stds[p] for p in at], dtype=torch.float32))
        self.register_buffer("taste_log", torch.tensor([c in spec.log_numeric for c in columns]))
        exposure = torch.tensor(spec.taste_exposure, dtype=torch.float32)
        propensity = torch.tensor(spec.taste_propensity, dtype=torch.float32)
        self.register_buffer("log_prior", torch.log(torch.tensor(spec.taste_prior, dtype=torch.float32)))
        self.register_buffer("log_exposure", exposure.log())
        self.register_buffer("log_propensity", propensity.log())
        self.register_buffer("log_unclicked", torch.log1p(-propensity))
        self.register_buffer("expected", exposure * propensity)

    def cluster_taste(self, numeric: torch.Tensor) -> torch.Tensor:
        """(rows, 1 + categories) the log of each user's expected positives per impression of a category under
        the taste-cluster mixture (ml.taste_clusters), its posterior from the user's counts (none: the
        prior); column 0, an unknown category, the mean of the others."""
        scaled = numeric[:, self.taste_position.clamp(min=0)] * self.taste_std + self.taste_mean
        counts = torch.where(self.taste_log, torch.expm1(scaled), scaled)
        counts = torch.where(self.taste_position >= 0, counts, torch.zeros_like(counts)).clamp(min=0.0)
        categories = self.expected.shape[1]
        shown, clicked = counts[:, :categories], counts[:, categories:]
        clicked = torch.minimum(clicked, shown)
        joint = (
            self.log_prior
            + shown @ self.log_exposure.T
            + clicked @ self.log_propensity.T
            + (shown - clicked) @ self.log_unclicked.T
        )
        expected = torch.log(torch.softmax(joint, dim=1) @ self.expected)
        return torch.cat([expected.mean(dim=1, keepdim=True), expected], dim=1)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.ids(inputs["ids"]), inputs["numeric"]]
        parts += [emb(inputs["categorical"][:, i]) for i, emb in enumerate(self.categories)]
        for i in range(self.histories):
            ids = inputs[f"history{i}"]  # item id + 1, 0 pads
            present = (ids > 0).unsqueeze(-1).float()
            known = (ids > 0) & (ids < self.item_ids.num_embeddings + 1)  # else the unseen bucket
            buckets = torch.where(known, ids - 1, UNSEEN)
            vectors = self.item_ids(buckets) * present
            parts.append(vectors.sum(dim=1) / present.sum(dim=1).clamp(min=1.0))
            if self.categories_of_history:
                counts = nn.functional.one_hot(self.item_category[buckets], self.categories_of_history) * present
                parts.append(counts.sum(dim=1) / present.sum(dim=1).clamp(min=1.0))
        if "embedding" in inputs:
            parts.append(inputs["embedding"])
        mixture = self.cluster_taste(inputs["numeric"]) if self.mixture else None
        if mixture is not None:
            parts.append(mixture)
        features = torch.cat(parts, dim=1)
        vectors = self.mlp(features) + self.direct(inputs["ids"])
        if self.taste is None:
            return vectors
        taste = self.taste(features)
        if mixture is not None:  # the mixture's term, with a learnt weight, and what the inputs add to it
            taste = taste + (1.0 + self.cluster_weight) * mixture
        return torch.cat([vectors, taste], dim=1)


class TwoTower(nn.Module):
    """User vector [user part, 1]; item vector [item part, bias + prior]: their dot product is the
    score (the log of the user's expected clicks on the item, up to a constant per user)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        dim, hidden = spec.config.dim, spec.config.hidden
        self.taste = spec.user.taste_categories  # of the dim values: the taste head and the item's category
        if self.taste:
            self.category_column = list(spec.item.categorical).index(HISTORY_ATTRIBUTE)
        self.item_tower = Tower(spec.item, hidden, dim + 1 - self.taste, id_dim=dim)
        self.user_tower = Tower(spec.user, hidden, dim - self.taste, item_ids=self.item_tower.ids, id_dim=dim)
        # the item's popularity prior per id bucket (`item_prior`; the unseen bucket: an item without rows),
        # which the score starts from (`set_prior`), saved with the weights
        self.register_buffer("item_prior", torch.zeros(spec.item.id_buckets))
        # learnt change of the prior's weight 1, where training sees the prior (data-parallel training
        # refuses a parameter without gradients)
        self.prior_weight = nn.Parameter(torch.zeros(1), requires_grad=trains_with_prior(spec.config))
        self._start_from_the_mixture()

    def _start_from_the_mixture(self) -> None:
        """The learnt terms of the score start at zero: an untrained network scores with the taste head's
        mixture and the prior alone (the strong baseline's score, in logs), and training adds to it only what
        the rows show. The item tower's other outputs keep their random start, so that the user tower's,
        which meet them in the dot product, get gradients."""
        user_out, item_out = self.user_tower.mlp[2], self.item_tower.mlp[2]
        with torch.no_grad():
            for tensor in (user_out.weight, user_out.bias, item_out.weight[-1], item_out.bias[-1:]):
                tensor.zero_()
            if self.user_tower.taste is not None:
                self.user_tower.taste.weight.zero_()
                self.user_tower.taste.bias.zero_()

    def set_prior(self, frame: pl.DataFrame) -> None:
        """The prior from labelled training rows (TrainConfig.prior)."""
        ids, values, unseen = item_prior(frame, self.spec.item.id_column, self.spec.config)
        prior = torch.full((self.spec.item.id_buckets,), unseen)
        prior[torch.from_numpy(self.spec.item.buckets(ids))] = torch.from_numpy(values.astype(np.float32))
        prior[UNSEEN] = unseen
        self.item_prior.copy_(prior)

    def set_history_categories(self, frame: pl.DataFrame) -> None:
        """Each item's category (its newest known value in the training rows) for pooling histories."""
        categories = self.spec.user.history_categories
        if not self.user_tower.categories_of_history:
            return
        known = frame.drop_nulls(HISTORY_ATTRIBUTE).sort("event_timestamp").unique("item_id", keep="last")
        index = {v: k + 1 for k, v in enumerate(categories)}
        lookup = torch.zeros_like(self.user_tower.item_category)
        for item, category in known.select(self.spec.item.id_column, HISTORY_ATTRIBUTE).iter_rows():
            if 0 < item < len(lookup):
                lookup[item] = index.get(category, 0)
        self.user_tower.item_category.copy_(lookup)

    def user_vectors(self, user_inputs: dict) -> torch.Tensor:
        vectors = self.user_tower(user_inputs)
        return torch.cat([vectors, torch.ones_like(vectors[:, :1])], dim=1)  # a traced export keeps the batch free

    def item_vectors(self, item_inputs: dict, with_prior: bool = True) -> torch.Tensor:
        """The tower's output with the popularity prior added to its bias (the last value)."""
        vectors = self.item_tower(item_inputs)
        if self.taste:
            category = nn.functional.one_hot(item_inputs["categorical"][:, self.category_column], self.taste)
            vectors = torch.cat([vectors[:, :-1], category.to(vectors.dtype), vectors[:, -1:]], dim=1)
        if not with_prior:
            return vectors
        prior = self.item_prior[item_inputs["ids"]] * (1.0 + self.prior_weight)
        return torch.cat([vectors[:, :-1], vectors[:, -1:] + prior.unsqueeze(1)], dim=1)

    def forward(self, user_inputs: dict, item_inputs: dict) -> torch.Tensor:
        """Scores of (user, item) pairs."""
        return (self.user_vectors(user_inputs) * self.item_vectors(item_inputs)).sum(dim=1)


class PersonalizationModel:
    """A trained two-tower model with the specs that turn frames into its inputs."""

    def __init__(self, network: TwoTower):
        self.network = network.eval()
        self.spec = network.spec

    @torch.no_grad()
    def user_vectors(self, users: pl.DataFrame) -> np.ndarray:
        return self.network.user_vectors(self.spec.user.encode(users)).numpy()

    @torch.no_grad()
    def item_vectors(self, items: pl.DataFrame) -> np.ndarray:
        return self.network.item_vectors(self.spec.item.encode(items)).numpy()

    @torch.no_grad()
    def score(self, rows: pl.DataFrame) -> np.ndarray:
        """Scores of (user, item) rows (the ranking score; higher: more likely clicked)."""
        return self.network(self.spec.user.encode(rows), self.spec.item.encode(rows)).numpy()

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.network.state_dict(), folder / MODEL_FILE)
        (folder / SPEC_FILE).write_text(self.spec.to_json())
        return folder

    @classmethod
    def load(cls, folder: Path) -> PersonalizationModel:
        spec = ModelSpec.from_json((Path(folder) / SPEC_FILE).read_text())
        network = TwoTower(spec)
        network.load_state_dict(torch.load(Path(folder) / MODEL_FILE, map_location="cpu", weights_only=True))
        return cls(network)


# --- data ---------------------------------------------------------------------------------------
def labelled(frame: pl.DataFrame) -> pl.DataFrame:
    """Training rows with one target: the impression led to a click or a play."""
    return frame.with_columns((pl.col("label_click") | pl.col("label_play")).cast(pl.Float32).alias(LABEL))


def item_prior(frame: pl.DataFrame, id_column: str, config: TrainConfig) -> tuple[np.ndarray, np.ndarray, float]:
    """Each item's popularity prior from labelled training rows, and that of an item without rows.

    "positives": log(1 + the item's positives). "category_share": the log of the item's share of its
    category's positives, estimated from its impressions, (1 + impressions) ** `prior_power` over the sum of
    that among the category's items: the feed shows an item as often as it is popular, and its impressions are
    twenty times as many as its clicks (a far less noisy estimate); the power (above 1) says that a popular
    item is also clicked more often when shown. With the user's expected positives per category (the taste
    head) the score is then the log of the user's expected positives on the item, as the taste-cluster
    mixture's; items of a category with many items share its positives."""
    counts = frame.group_by(id_column).agg(pl.len().alias("shown"), pl.col(LABEL).sum().alias("positives"))
    ids = counts.get_column(id_column).to_numpy()
    if config.prior == "positives":
        return ids, np.log1p(counts.get_column("positives").to_numpy().astype(np.float64)), 0.0
    if config.prior != "category_share":
        raise ValueError(f"prior must be positives or category_share, not {config.prior!r}")
    if HISTORY_ATTRIBUTE in frame.columns:
        known = frame.drop_nulls(HISTORY_ATTRIBUTE)
        if "event_timestamp" in known.columns:  # the newest known category of each item
            known = known.sort("event_timestamp")
        known = known.unique(id_column, keep="last", maintain_order=True)
        counts = counts.join(known.select(id_column, HISTORY_ATTRIBUTE), on=id_column, how="left")
    else:
        counts = counts.with_columns(pl.lit(None, pl.String).alias(HISTORY_ATTRIBUTE))
    weight = (1.0 + pl.col("shown").cast(pl.Float64)) ** config.prior_power
    shares = counts.with_columns(weight.alias("w")).with_columns(
        (pl.col("w") / pl.col("w").sum().over(HISTORY_ATTRIBUTE)).log().alias("prior"),
        (-pl.col("w").sum().over(HISTORY_ATTRIBUTE).log()).alias("unseen"),
    )
    unseen = float(shares.unique(HISTORY_ATTRIBUTE).get_column("unseen").mean())
    return shares.get_column(id_column).to_numpy(), shares.get_column("prior").to_numpy(), unseen


# Views of an item's catalogue attributes, fixed from its first delivery (a change is rare and small): a
# row read before the item's first daily feature run gets them from the item's first known row.
FIXED_ITEM_VIEWS = ("item_content", "item_geometry")


def with_fixed_item_attributes(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows whose fixed item attributes are null (read before the item's first daily feature run) given the
    item's first known ones: a null there would teach the item tower an "unknown" that serving never meets.
    A row's attributes are filled only where its whole view is null, so a value that is null by nature
    (the volume of a broken mesh) stays null."""
    for view in FIXED_ITEM_VIEWS:
        columns = [c for c in frame.columns if c.split("__", 1)[0] == view]
        if not columns:
            continue
        empty = pl.all_horizontal(pl.col(c).is_null() for c in columns)
        first = (
            frame.filter(~empty)
            .sort("event_timestamp")
            .unique("item_id", keep="first")
            .select("item_id", *[pl.col(c).alias(f"_first_{c}") for c in columns])
        )
        frame = (
            frame.join(first, on="item_id", how="left", maintain_order="left")
            .with_columns(pl.when(empty).then(pl.col(f"_first_{c}")).otherwise(pl.col(c)).alias(c) for c in columns)
            .drop(f"_first_{c}" for c in columns)
        )
    return frame


def feature_coverage(raw: pl.DataFrame, filled: pl.DataFrame) -> dict[str, int]:
    """How many training rows lacked features, before and after the fixed item attributes were filled: rows
    whose every daily user view is null (read before the user's first daily run) stay in training, learnt
    through the ids and the profile, and are counted here so that they never train silently."""
    user_views = [i.view for i in USER_INPUTS if i.view != "user_profile"]
    item_views = [i.view for i in ITEM_INPUTS]

    def without(frame: pl.DataFrame, views: list[str]) -> int:
        columns = [c for c in frame.columns if c.split("__", 1)[0] in views]
        if not columns:
            return frame.height
        return frame.filter(pl.all_horizontal(pl.col(c).is_null() for c in columns)).height

    return {
        "rows": raw.height,
        "rows_without_user_features": without(raw, user_views),
        "rows_without_item_features": without(raw, item_views),
        "rows_without_item_features_after_filling": without(filled, item_views),
    }


def build_spec(train: pl.DataFrame, config: TrainConfig, item_embeddings: pl.DataFrame | None = None) -> ModelSpec:
    """Tower specs from the training frame's columns (`<view>__<feature>`) and statistics."""

    def tower(id_column: str, inputs: tuple[TowerInput, ...]) -> TowerSpec:
        views = {i.view: i for i in inputs}
        columns = [c for c in train.columns if c.split("__", 1)[0] in views]
        # a number that never varies in the training rows (a view before its first day) teaches
        # nothing and would meet unseen values later: left out
        numeric = [
            c
            for c in columns
            if (train.schema[c].is_numeric() or train.schema[c] == pl.Boolean)
            and train.get_column(c).cast(pl.Float64).fill_nan(None).fill_null(0.0).n_unique() > 1
        ]
        logs = [c for c in numeric if views[c.split("__", 1)[0]].log_counts]
        categorical = {
            c: sorted(v for v in train.get_column(c).drop_nulls().unique().to_list())
            for c in columns
            if train.schema[c] == pl.String
        }
        histories = [c for c in columns if train.schema[c] == pl.List(pl.Int64)]
        spec = TowerSpec(id_column, 2, numeric, [], [], categorical, histories, log_numeric=logs)
        values = [
            spec.scale(c, train.get_column(c).cast(pl.Float64).fill_nan(None).fill_null(0.0).to_numpy())
            for c in numeric
        ]
        spec.means = [float(v.mean()) if len(v) else 0.0 for v in values]
        spec.stds = [float(v.std(ddof=1)) if len(v) > 1 and v.std() > 0 else 1.0 for v in values]
        spec.id_buckets = max(int(train.get_column(id_column).max()) + 1, 2)
        return spec

    item = tower("item_id", ITEM_INPUTS)
    if item_embeddings is not None and item_embeddings.height:
        item.embedding_column = "item_embedding"
        item.embedding_dim = len(item_embeddings.get_column("item_embedding")[0])
    user = tower("user_id", USER_INPUTS)
    if user.histories:
        user.history_categories = item.categorical.get(HISTORY_ATTRIBUTE, [])
    if config.taste and HISTORY_ATTRIBUTE in item.categorical:
        user.taste_categories = len(item.categorical[HISTORY_ATTRIBUTE]) + 1
        if user.taste_categories >= config.dim:
            raise ValueError(f"dim {config.dim} leaves no room beside {user.taste_categories} taste values")
        with_cluster_taste(user, train, item.categorical[HISTORY_ATTRIBUTE], config.seed)
    return ModelSpec(user=user, item=item, config=config)


def with_cluster_taste(user: TowerSpec, train: pl.DataFrame, categories: list[str], seed: int) -> None:
    """The taste-cluster mixture fitted on the training rows, stored in the user tower's spec, when the rows
    hold the user's counts of every category (TASTE_VIEW)."""
    impressions = [f"{TASTE_VIEW}__impressions_{TASTE_WINDOW}_{c}" for c in categories]
    clicks = [f"{TASTE_VIEW}__clicks_{TASTE_WINDOW}_{c}" for c in categories]
    if any(c not in train.columns for c in impressions + clicks):
        return
    mixture = taste_clusters.fit(train, LABEL, seed=seed)
    order = [mixture.categories.index(c) for c in categories]
    user.taste_impressions, user.taste_clicks = impressions, clicks
    user.taste_prior = mixture.prior.tolist()
    user.taste_exposure = mixture.exposure[:, order].tolist()
    user.taste_propensity = mixture.propensity[:, order].tolist()


def with_item_embeddings(frame: pl.DataFrame, item_embeddings: pl.DataFrame | None) -> pl.DataFrame:
    """Join the items' CLIP embeddings (`item_id`, `item_embedding`) where the model uses them; rows
    that already carry one (joined as of their time) keep it."""
    if item_embeddings is None or "item_embedding" in frame.columns:
        return frame
    return frame.join(item_embeddings.select("item_id", "item_embedding"), on="item_id", how="left")


def _padded_ids(lists: pl.Series, length: int = 10) -> np.ndarray:
    """Item-id lists as a (rows, length) matrix of id + 1, 0 where a list is shorter."""
    matrix = np.zeros((len(lists), length), dtype=np.int64)
    for i, ids in enumerate(lists.to_list()):
        if ids:
            ids = ids[-length:]
            matrix[i, : len(ids)] = np.asarray(ids) + 1
    return matrix


def _embedding_matrix(frame: pl.DataFrame, column: str, dim: int) -> np.ndarray:
    matrix = np.zeros((frame.height, dim), dtype=np.float32)
    for i, vector in enumerate(frame.get_column(column).to_list()):
        if vector is not None:
            matrix[i] = vector
    return matrix


# --- training -----------------------------------------------------------------------------------
def trains_with_prior(config: TrainConfig) -> bool:
    """Whether the training logit holds the popularity prior: with catalogue negatives or log-Q-corrected
    logits (which estimate the whole score); impression negatives in a plain logistic loss carry no popularity."""
    return config.negatives_from == "catalogue" or config.loss in ("softmax", "binary_log_q")


class Objective(nn.Module):
    """The training forward pass (one module, so that data-parallel training syncs its gradients):
    scores of the shown pairs and of `negatives` items drawn for each pair's user."""

    def __init__(self, network: TwoTower):
        super().__init__()
        self.network = network

    def forward(self, users: dict, shown: dict, drawn: dict) -> tuple[torch.Tensor, torch.Tensor]:
        # negatives drawn as often as shown carry no popularity to learn: with the prior in the logit,
        # training would only learn to cancel it, so the term learns beside it and the score adds it
        with_prior = trains_with_prior(self.network.spec.config)
        user_vectors = self.network.user_vectors(users)
        repeats = len(drawn["ids"]) // len(user_vectors)
        return (
            (user_vectors * self.network.item_vectors(shown, with_prior)).sum(dim=1),
            (user_vectors.repeat(repeats, 1) * self.network.item_vectors(drawn, with_prior)).sum(dim=1),
        )


def fit(
    objective: nn.Module,
    frame: pl.DataFrame,
    device: torch.device | str = "cpu",
    rank: int = 0,
    on_epoch=None,
    resume: dict | None = None,
) -> list[float]:
    """Train an `Objective` (or its data-parallel wrapper) on labelled rows, one worker's shard; returns
    the loss per epoch. `on_epoch(epoch, losses, state)` runs after each epoch (Ray Train reports and
    checkpoints there) and stops the training by returning True; `resume`, a `state` it was given (the
    objective already holds that epoch's weights), continues with the next epoch as if the run had not
    stopped."""
    spec: ModelSpec = (objective.module if hasattr(objective, "module") else objective).network.spec
    config = spec.config
    user_inputs, item_inputs = spec.user.encode(frame), spec.item.encode(frame)
    pool, first, size, pool_rows = _negative_pool(frame, spec.item, item_inputs, config.negatives_from)
    optimizer = torch.optim.Adam(objective.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    labels = torch.from_numpy(frame.get_column(LABEL).to_numpy().astype(np.float32))
    log_q = _log_impression_shares(frame)
    generator = torch.Generator().manual_seed(config.seed + rank)
    losses: list[float] = []
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        generator.set_state(resume["generator"])
        torch.set_rng_state(resume["torch_rng"])
        losses = list(resume["losses"])
    trained_rows = _positive_rows(labels, config.positives)
    for epoch in range(len(losses), config.epochs):
        objective.train()
        order = trained_rows[torch.randperm(len(trained_rows), generator=generator)]
        total, batches = 0.0, 0
        for start in range(0, len(order), config.batch_size):
            index = order[start : start + config.batch_size]
            # per row, negatives drawn from its day's pool (with that day's features)
            rows = index.repeat(config.negatives)
            sampled = pool_rows[first[rows] + (torch.rand(len(rows), generator=generator) * size[rows]).long()]
            shown, unshown = objective(
                _batch(user_inputs, index, config.unseen_share, generator, device),
                _batch(item_inputs, index, config.unseen_share, generator, device),
                _batch(pool, sampled, config.unseen_share, generator, device),
            )
            clicked = (1.0 + (config.click_weight - 1.0) * labels[index]).to(device)
            loss = _loss(config.loss, shown, unshown, log_q[index].to(device), log_q[sampled].to(device), clicked)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(total / max(batches, 1))
        if on_epoch is not None:
            state = {"optimizer": optimizer.state_dict(), "generator": generator.get_state()}
            if on_epoch(epoch, losses, {**state, "torch_rng": torch.get_rng_state(), "losses": list(losses)}):
                break
    return losses


def _positive_rows(labels: torch.Tensor, positives: str) -> torch.Tensor:
    """The rows that train as the shown pairs: every impression ("shown") or the clicked and played ones."""
    if positives == "shown":
        return torch.arange(len(labels))
    if positives == "clicked":
        return torch.nonzero(labels > 0).flatten()
    raise ValueError(f"positives must be shown or clicked, not {positives!r}")


def _loss(kind: str, shown, unshown, log_q_shown, log_q_drawn, weight) -> torch.Tensor:
    """The batch's loss (TrainConfig.loss): shown pairs (weighted) against their drawn negatives."""
    if kind == "softmax":
        return _corrected_softmax_loss(shown, unshown, log_q_shown, log_q_drawn, weight)
    if kind == "binary_log_q":  # the prior inside the logits, each less the log of its chance of being drawn
        shown, unshown = shown - log_q_shown, unshown - log_q_drawn
    elif kind != "binary":
        raise ValueError(f"loss must be binary, binary_log_q or softmax, not {kind!r}")
    target = torch.cat([torch.ones(len(shown)), torch.zeros(len(unshown))]).to(shown.device)
    weights = torch.cat([weight, torch.ones(len(unshown), device=shown.device)])
    return nn.functional.binary_cross_entropy_with_logits(torch.cat([shown, unshown]), target, weight=weights)


def _corrected_softmax_loss(shown, unshown, log_q_shown, log_q_drawn, weight) -> torch.Tensor:
    """Weighted cross-entropy of each shown pair (column 0) against its drawn negatives, every logit less the
    log of its chance of being drawn (the sampling-bias correction of Yi et al. 2019)."""
    negatives = len(unshown) // len(shown)
    logits = torch.cat(
        [(shown - log_q_shown).unsqueeze(1), (unshown - log_q_drawn).view(negatives, len(shown)).T], dim=1
    )
    losses = nn.functional.cross_entropy(
        logits, torch.zeros(len(shown), dtype=torch.long, device=logits.device), reduction="none"
    )
    return (losses * weight).sum() / weight.sum()


def _log_impression_shares(frame: pl.DataFrame) -> torch.Tensor:
    """Per row, the log of its item's share of its day's rows: the chance an impression negative drawn for
    that day is this item."""
    day = pl.col("event_timestamp").dt.date()
    shares = frame.select((pl.len().over(day, "item_id") / pl.len().over(day)).log().alias("q"))
    return torch.from_numpy(shares.get_column("q").to_numpy().astype(np.float32))


def _negative_pool(frame: pl.DataFrame, item: TowerSpec, item_inputs: dict, source: str):
    """Encoded item rows to draw negatives from and, per training row, the first position and the
    count of its day's rows among them, positions mapped to rows by the last tensor."""
    if source == "catalogue":
        catalogue, first, size = _daily_catalogues(frame, item)
        return catalogue, first, size, torch.arange(len(catalogue["ids"]))
    if source != "impressions":
        raise ValueError(f"negatives_from must be catalogue or impressions, not {source!r}")
    days = frame.get_column("event_timestamp").dt.date().to_physical().to_numpy()
    order = np.argsort(days, kind="stable")
    values, starts, counts = np.unique(days[order], return_index=True, return_counts=True)
    at = np.searchsorted(values, days)
    return item_inputs, torch.from_numpy(starts[at]), torch.from_numpy(counts[at]), torch.from_numpy(order)


def _daily_catalogues(
    frame: pl.DataFrame, item: TowerSpec
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The negatives: every item shown on a day, with its features as of that day
    (its first row of the day), encoded day after day; and per training row the first catalogue
    row of its day and the day's item count. A negative from another time (the newest catalogue,
    say) would differ from the shown items by its features' time alone (a null before the first
    daily run), which the model would learn instead of what users are shown."""
    day = pl.col("event_timestamp").dt.date().alias("_day")
    items = (
        frame.with_columns(day)
        .sort("_day", "event_timestamp")
        .unique(["_day", item.id_column], keep="first", maintain_order=True)
    )
    days = (
        items.group_by("_day", maintain_order=True)
        .len()
        .with_columns((pl.col("len").cum_sum() - pl.col("len")).alias("_first"))
    )
    per_row = frame.select(day).join(days, on="_day", how="left", maintain_order="left")
    return (
        item.encode(items),
        torch.from_numpy(per_row.get_column("_first").to_numpy().astype(np.int64)),
        torch.from_numpy(per_row.get_column("len").to_numpy().astype(np.int64)),
    )


def _batch(
    inputs: dict[str, torch.Tensor], index: torch.Tensor, unseen_share: float, generator, device
) -> dict[str, torch.Tensor]:
    """Rows of encoded inputs, a share of their ids replaced by the unseen bucket."""
    batch = {k: v[index] for k, v in inputs.items()}
    if unseen_share > 0:
        hide = torch.rand(len(index), generator=generator) < unseen_share
        batch["ids"] = torch.where(hide, torch.full_like(batch["ids"], UNSEEN), batch["ids"])
    return {k: v.to(device) for k, v in batch.items()}


def fit_selected(
    objective: nn.Module,
    frame: pl.DataFrame,
    selection: EpochSelection,
    device: torch.device | str = "cpu",
    rank: int = 0,
    world: int = 1,
    on_epoch=None,
    resume: dict | None = None,
) -> list[float]:
    """`fit` with model selection: after each epoch the selection scores the network on its validation day
    and keeps the best state; training stops where rank 0's selection says, on every rank (a data-parallel
    run's workers step together). `on_epoch(epoch, losses, state, last)` as `fit`'s, told the last epoch."""
    epochs = (objective.module if hasattr(objective, "module") else objective).network.spec.config.epochs

    def after(epoch: int, losses: list[float], state: dict) -> bool:
        stop = _agreed(selection.after_epoch(epoch), world, device)
        if on_epoch is not None:
            on_epoch(epoch, losses, state, stop or epoch == epochs - 1)
        return stop

    return fit(objective, frame, device, rank, after, resume)


def _agreed(flag: bool, world: int, device: torch.device | str) -> bool:
    """Rank 0's flag on every rank of a data-parallel run."""
    if world == 1:
        return flag
    value = torch.tensor([float(flag)], device=device)
    torch.distributed.broadcast(value, src=0)
    return bool(value.item())


def selection_for(network: TwoTower, loop_config: dict, rank: int, resumed: dict | None) -> EpochSelection:
    """Rank 0's selection on the validation day (the other ranks' selects nothing: rank 0 decides)."""
    validation = loop_config.get("validation")
    spec, config = network.spec, network.spec.config
    if rank != 0 or validation is None:
        return EpochSelection(network, None, config.patience)
    checked = ValidationSet.of(spec, validation, loop_config["train"])
    return EpochSelection(network, checked, config.patience, (resumed or {}).get(SELECTION_FILE))


def train_loop_per_worker(loop_config: dict) -> None:
    """One data-parallel worker: its shard of the rows, the synchronised model, a loss per epoch, the best
    epoch on the validation day kept (rank 0's selection)."""
    import ray.train
    import ray.train.torch

    spec: ModelSpec = loop_config["spec"]
    torch.manual_seed(spec.config.seed)
    torch.set_num_threads(spec.config.cpus_per_worker)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    network = TwoTower(spec)
    network.set_prior(loop_config["train"])  # from every row, the same on every worker
    network.set_history_categories(loop_config["train"])
    checkpoints = EpochCheckpoints(loop_config, rank)
    resumed = checkpoints.resumed()  # after a restart (a lost worker or node): the latest epoch's state
    if resumed is not None:
        network.load_state_dict(resumed[MODEL_FILE])  # before the wrap, which syncs rank 0's weights
    selection = selection_for(network, loop_config, rank, resumed)  # the start scored before any step
    objective = ray.train.torch.prepare_model(Objective(network))

    own = (resumed or {}).get("rank") or (resumed or {}).get(RANK_FILE.format(rank=0)) or {}
    nodes = list(own.get("nodes", []))  # the node that trained each epoch, across restarts

    def report(epoch: int, losses: list[float], state: dict, last: bool) -> None:
        nodes.append(node_id())
        metrics = {
            "epoch": epoch,
            "train_loss": losses[-1],
            "loss_curve": list(losses),
            "epoch_nodes": list(nodes),
            "validation_scores": list(selection.scores),
            "selected_epoch": selection.best_epoch,
        }
        own_state = {**{k: state[k] for k in ("generator", "torch_rng", "losses")}, "nodes": list(nodes)}
        files = {RANK_FILE.format(rank=rank): own_state}
        if rank == 0:
            inner = objective.module if hasattr(objective, "module") else objective
            files |= {MODEL_FILE: inner.network.state_dict(), OPTIMIZER_FILE: state["optimizer"]}
            files |= {SELECTION_FILE: selection.state()}
        checkpoints.report(epoch, metrics, files, last=last)

    resume = {**own, "optimizer": resumed[OPTIMIZER_FILE]} if resumed is not None else None
    device = ray.train.torch.get_device()
    fit_selected(objective, loop_config["train"][rank::world], selection, device, rank, world, report, resume)


@dataclass
class TrainResult:
    model: PersonalizationModel
    loss_curve: list[float]
    coverage: dict[str, int] = field(default_factory=dict)  # feature_coverage of the training rows
    epoch_nodes: list[str] = field(default_factory=list)  # the Ray node that trained each epoch
    # the validation day's score (mean of recall@10 and NDCG@10) of the start (0) and after each epoch, and the
    # epoch kept (ml.epoch_selection); none without a validation day
    validation_scores: list[float] = field(default_factory=list)
    selected_epoch: int | None = None
    validation_rows: int = 0


def train(
    train_frame: pl.DataFrame, config: TrainConfig, storage_path: Path, item_embeddings: pl.DataFrame | None = None
) -> TrainResult:
    """Train on Ray Train (Ray must be initialised: in-process or a cluster), a share of the newest day's users
    held out to select the epoch (TrainConfig.validation_share)."""
    from ray.train import ScalingConfig

    if train_frame.is_empty():
        raise ValueError("no training rows")
    raw = labelled(with_item_embeddings(train_frame, item_embeddings))
    # the prior and the mixture are fitted without the validation rows: the start cannot have seen them
    frame, validation = split_validation(with_fixed_item_attributes(raw), config.validation_share, config.seed)
    spec = build_spec(frame, config, item_embeddings)
    network = TwoTower(spec)
    scaling = ScalingConfig(
        num_workers=config.num_workers, use_gpu=config.use_gpu, resources_per_worker={"CPU": config.cpus_per_worker}
    )
    loop_config = {"spec": spec, "train": frame, "validation": validation if validation.height else None}
    with fitted(train_loop_per_worker, loop_config, scaling, storage_path, "personalization") as result:
        with result.checkpoint.as_directory() as folder:
            network.load_state_dict(selected_weights(Path(folder)))
    metrics = result.metrics
    scores = [s for s in metrics.get("validation_scores", []) if not np.isnan(s)]
    return TrainResult(
        PersonalizationModel(network),
        list(metrics["loss_curve"]),
        coverage=feature_coverage(raw, frame),
        epoch_nodes=list(metrics["epoch_nodes"]),
        validation_scores=scores,
        selected_epoch=metrics.get("selected_epoch") if scores else None,
        validation_rows=validation.height,
    )


def selected_weights(folder: Path) -> dict:
    """A training checkpoint's selected weights (the last epoch's where nothing was selected)."""
    selection = folder / SELECTION_FILE
    if selection.exists():
        return torch.load(selection, map_location="cpu", weights_only=True)["state"]
    return torch.load(folder / MODEL_FILE, map_location="cpu", weights_only=True)
