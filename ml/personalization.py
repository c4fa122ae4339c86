"""The personalization model: a two-tower retrieval model in torch whose dot product also ranks.

The user tower sees the user's id and the user-side features of the `personalization_ranking`
feature service, the item tower the item's id, its item-side features and, where present, its CLIP
embedding. Both towers end in vectors of the same size, so the item vectors go into the vector
database and a user vector retrieves its candidates there; the same dot product is the ranking score.

Training runs on Ray Train (`TorchTrainer`): data-parallel, each worker takes its shard of the rows.
Plain Python, no Dagster.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn

# The item tower learns popularity itself (its id and a bias against uniformly drawn negatives): the
# windowed popularity counts grow with the length of history, so they drift between early and late days.
USER_VIEWS = ("user_profile", "user_engagement")
ITEM_VIEWS = ("item_content",)
LABEL = "label"
MODEL_FILE = "model.pt"
SPEC_FILE = "model.json"


@dataclass
class TrainConfig:
    dim: int = 16
    hidden: int = 64
    epochs: int = 10
    batch_size: int = 512
    learning_rate: float = 0.01
    weight_decay: float = 1e-4
    seed: int = 0
    # uniformly drawn items per training row, as negatives: the more there are, the closer the score
    # comes to a user's expected clicks on an item (shown often x clicked when shown) rather than to
    # its click rate when shown alone, which is what ranking all items needs
    negatives: int = 8
    num_workers: int = 1
    use_gpu: bool = False


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

    @property
    def columns(self) -> list[str]:
        embedding = [self.embedding_column] if self.embedding_column else []
        return [self.id_column, *self.numeric, *self.categorical, *self.histories, *embedding]

    def encode(self, frame: pl.DataFrame) -> dict[str, torch.Tensor]:
        """Model inputs from a frame with this tower's columns (missing numeric values count as 0)."""
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise ValueError(f"{self.id_column} tower: input lacks columns {missing}")
        ids = frame.get_column(self.id_column).cast(pl.Int64).to_numpy() % self.id_buckets
        numeric = np.zeros((frame.height, len(self.numeric)), dtype=np.float32)
        for i, column in enumerate(self.numeric):
            values = frame.get_column(column).cast(pl.Float64).fill_null(0.0).fill_nan(0.0).to_numpy()
            numeric[:, i] = (values - self.means[i]) / self.stds[i]
        categorical = np.zeros((frame.height, len(self.categorical)), dtype=np.int64)
        for i, (column, values) in enumerate(self.categorical.items()):
            index = {v: k + 1 for k, v in enumerate(values)}
            categorical[:, i] = [index.get(v, 0) for v in frame.get_column(column).cast(pl.String).to_list()]
        inputs = {"ids": torch.from_numpy(ids), "numeric": torch.from_numpy(numeric),
                  "categorical": torch.from_numpy(categorical)}
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        raw = json.loads(text)
        return cls(user=TowerSpec(**raw["user"]), item=TowerSpec(**raw["item"]), config=TrainConfig(**raw["config"]))


class Tower(nn.Module):
    def __init__(self, spec: TowerSpec, dim: int, hidden: int, extra_outputs: int = 0,
                 item_ids: nn.Embedding | None = None):
        super().__init__()
        self.ids = nn.Embedding(spec.id_buckets, dim)
        self.categories = nn.ModuleList(nn.Embedding(len(v) + 1, 8) for v in spec.categorical.values())
        self.item_ids = item_ids  # shared with the item tower: a history is the mean of its items
        self.histories = len(spec.histories)
        width = dim + len(spec.numeric) + 8 * len(spec.categorical) + spec.embedding_dim + dim * self.histories
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, dim + extra_outputs))

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.ids(inputs["ids"]), inputs["numeric"]]
        parts += [emb(inputs["categorical"][:, i]) for i, emb in enumerate(self.categories)]
        for i in range(self.histories):
            ids = inputs[f"history{i}"]  # item id + 1, 0 pads
            present = (ids > 0).unsqueeze(-1).float()
            vectors = self.item_ids((ids - 1).clamp(min=0) % self.item_ids.num_embeddings) * present
            parts.append(vectors.sum(dim=1) / present.sum(dim=1).clamp(min=1.0))
        if "embedding" in inputs:
            parts.append(inputs["embedding"])
        return self.mlp(torch.cat(parts, dim=1))


class TwoTower(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.item_tower = Tower(spec.item, spec.config.dim, spec.config.hidden, extra_outputs=1)
        self.user_tower = Tower(spec.user, spec.config.dim, spec.config.hidden, item_ids=self.item_tower.ids)

    def forward(self, user_inputs: dict, item_inputs: dict) -> torch.Tensor:
        return (self.user_vectors(user_inputs) * self.item_tower(item_inputs)).sum(dim=1)

    def user_vectors(self, user_inputs: dict) -> torch.Tensor:
        """The user tower's vector and a constant 1 that meets the item tower's bias (its last value)."""
        vectors = self.user_tower(user_inputs)
        return torch.cat([vectors, torch.ones(len(vectors), 1, device=vectors.device)], dim=1)


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
        return self.network.item_tower(self.spec.item.encode(items)).numpy()

    @torch.no_grad()
    def score(self, rows: pl.DataFrame) -> np.ndarray:
        """Click logits of (user, item) rows."""
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


def build_spec(train: pl.DataFrame, config: TrainConfig, item_embeddings: pl.DataFrame | None = None) -> ModelSpec:
    """Tower specs from the training frame's columns (`<view>__<feature>`) and statistics."""
    def tower(id_column: str, views: tuple[str, ...]) -> TowerSpec:
        columns = [c for c in train.columns if c.split("__", 1)[0] in views]
        numeric = [c for c in columns if train.schema[c].is_numeric() or train.schema[c] == pl.Boolean]
        categorical = {c: sorted(v for v in train.get_column(c).drop_nulls().unique().to_list())
                       for c in columns if train.schema[c] == pl.String}
        histories = [c for c in columns if train.schema[c] == pl.List(pl.Int64)]
        stats = train.select([pl.col(c).cast(pl.Float64).fill_nan(None) for c in numeric])
        means = [float(stats.get_column(c).mean() or 0.0) for c in numeric]
        stds = [float(stats.get_column(c).std() or 0.0) or 1.0 for c in numeric]
        ids = int(train.get_column(id_column).max()) + 1
        return TowerSpec(id_column, max(ids, 2), numeric, means, stds, categorical, histories)

    item = tower("item_id", ITEM_VIEWS)
    if item_embeddings is not None and item_embeddings.height:
        item.embedding_column = "item_embedding"
        item.embedding_dim = len(item_embeddings.get_column("item_embedding")[0])
    return ModelSpec(user=tower("user_id", USER_VIEWS), item=item, config=config)


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
            matrix[i, :len(ids)] = np.asarray(ids) + 1
    return matrix


def _embedding_matrix(frame: pl.DataFrame, column: str, dim: int) -> np.ndarray:
    matrix = np.zeros((frame.height, dim), dtype=np.float32)
    for i, vector in enumerate(frame.get_column(column).to_list()):
        if vector is not None:
            matrix[i] = vector
    return matrix


# --- training (inside Ray Train workers) --------------------------------------------------------
def train_loop_per_worker(loop_config: dict) -> None:
    """One data-parallel worker: its shard of the rows, the synchronised model, a loss per epoch."""
    import ray.train
    import ray.train.torch

    spec: ModelSpec = loop_config["spec"]
    config = spec.config
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    frame: pl.DataFrame = loop_config["train"][rank::world]
    user_inputs, item_inputs = spec.user.encode(frame), spec.item.encode(frame)
    labels = torch.from_numpy(frame.get_column(LABEL).to_numpy())
    # uniformly drawn items as extra negatives teach what is rarely wanted at all, not only what is
    # clicked among the (popularity-skewed) items shown
    catalogue = spec.item.encode(frame.sort("event_timestamp").unique("item_id", keep="last"))
    n_items = len(catalogue["ids"])
    network = ray.train.torch.prepare_model(TwoTower(spec))
    device = ray.train.torch.get_device()
    optimizer = torch.optim.Adam(network.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    loss_fn = nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(config.seed + rank)
    losses = []
    for epoch in range(config.epochs):
        network.train()
        order = torch.randperm(len(labels), generator=generator)
        total, batches = 0.0, 0
        for start in range(0, len(order), config.batch_size):
            index = order[start:start + config.batch_size]
            users = {k: v[index].to(device) for k, v in user_inputs.items()}
            sampled = torch.randint(n_items, (len(index) * config.negatives,), generator=generator)
            repeated = {k: torch.cat([v] * config.negatives) for k, v in users.items()}
            logits = torch.cat([
                network(users, {k: v[index].to(device) for k, v in item_inputs.items()}),
                network(repeated, {k: v[sampled].to(device) for k, v in catalogue.items()}),
            ])
            target = torch.cat([labels[index], torch.zeros(len(sampled))]).to(device)
            loss = loss_fn(logits, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + float(loss), batches + 1
        losses.append(total / max(batches, 1))
        metrics = {"epoch": epoch, "train_loss": losses[-1], "loss_curve": list(losses)}
        if epoch == config.epochs - 1 and rank == 0:
            with tempfile.TemporaryDirectory() as folder:
                inner = network.module if hasattr(network, "module") else network
                torch.save(inner.state_dict(), Path(folder) / MODEL_FILE)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)


@dataclass
class TrainResult:
    model: PersonalizationModel
    loss_curve: list[float]


def train(train_frame: pl.DataFrame, config: TrainConfig, storage_path: Path,
          item_embeddings: pl.DataFrame | None = None) -> TrainResult:
    """Train on Ray Train (Ray must be initialised: in-process or a cluster)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if train_frame.is_empty():
        raise ValueError("no training rows")
    frame = labelled(with_item_embeddings(train_frame, item_embeddings))
    spec = build_spec(frame, config, item_embeddings)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"spec": spec, "train": frame},
        scaling_config=ScalingConfig(num_workers=config.num_workers, use_gpu=config.use_gpu,
                                     resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(storage_path), name="personalization"),
    )
    result = trainer.fit()
    network = TwoTower(spec)
    with result.checkpoint.as_directory() as folder:
        network.load_state_dict(torch.load(Path(folder) / MODEL_FILE, map_location="cpu", weights_only=True))
    return TrainResult(PersonalizationModel(network), list(result.metrics["loss_curve"]))


# --- evaluation ---------------------------------------------------------------------------------
def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (rank statistic, ties counted half)."""
    labels = np.asarray(labels, dtype=bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs positive and negative rows")
    ranks = pl.Series(scores).rank("average").to_numpy()
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def ranking_metrics(ranked: dict[int, list[int]], relevant: dict[int, set[int]], k: int) -> dict[str, float]:
    """Mean recall@k and NDCG@k over the users with relevant items."""
    recalls, ndcgs = [], []
    for user, items in relevant.items():
        top = ranked.get(user, [])[:k]
        hits = [1.0 if i in items else 0.0 for i in top]
        recalls.append(sum(hits) / len(items))
        ideal = sum(1 / math.log2(r + 2) for r in range(min(len(items), k)))
        ndcgs.append(sum(h / math.log2(r + 2) for r, h in enumerate(hits)) / ideal)
    return {f"recall@{k}": float(np.mean(recalls)), f"ndcg@{k}": float(np.mean(ndcgs))}


def popularity(train_frame: pl.DataFrame) -> dict[int, float]:
    """The baseline: each item's positives in the training rows."""
    counts = labelled(train_frame).group_by("item_id").agg(pl.col(LABEL).sum())
    return dict(zip(counts.get_column("item_id").to_list(), counts.get_column(LABEL).to_list()))


def evaluate(model: PersonalizationModel, train_frame: pl.DataFrame, held_out: pl.DataFrame, k: int = 10,
             item_embeddings: pl.DataFrame | None = None) -> dict[str, dict[str, float]]:
    """AUC on held-out impressions; recall@k and NDCG@k of ranking every item seen in training for
    each held-out user with a positive; the same for the popularity baseline."""
    rows = labelled(with_item_embeddings(held_out, item_embeddings))
    labels = rows.get_column(LABEL).to_numpy() > 0
    popular = popularity(train_frame)
    baseline_scores = np.array([popular.get(i, 0.0) for i in rows.get_column("item_id").to_list()])

    # every candidate item with its latest known features; every user with theirs
    item_columns = [c for c in model.spec.item.columns if c != model.spec.item.embedding_column]
    items = with_item_embeddings(
        pl.concat([train_frame, held_out], how="diagonal_relaxed").sort("event_timestamp")
        .select(item_columns).unique("item_id", keep="last").sort("item_id"), item_embeddings)
    user_columns = model.spec.user.columns
    users = rows.sort("event_timestamp").select(user_columns).unique("user_id", keep="first").sort("user_id")
    scores = model.user_vectors(users) @ model.item_vectors(items).T
    item_ids = np.array(items.get_column("item_id").to_list())
    user_ids = users.get_column("user_id").to_list()
    ranked = {u: item_ids[np.argsort(-scores[i], kind="stable")[:k]].tolist() for i, u in enumerate(user_ids)}
    popular_order = sorted(item_ids.tolist(), key=lambda i: -popular.get(i, 0.0))[:k]
    positives = rows.filter(pl.col(LABEL) > 0).group_by("user_id").agg(pl.col("item_id").unique())
    relevant = {u: set(i) for u, i in positives.iter_rows()}
    return {
        "model": {"auc": auc(labels, model.score(rows)), **ranking_metrics(ranked, relevant, k)},
        "popularity": {"auc": auc(labels, baseline_scores),
                       **ranking_metrics({u: popular_order for u in relevant}, relevant, k)},
    }


def split_held_out(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Train on every day but the newest; hold the newest out."""
    days = frame.get_column("event_timestamp").dt.date()
    newest = days.max()
    if days.n_unique() < 2:
        raise ValueError(f"need at least two days of training data to hold one out, got only {newest}")
    return frame.filter(days < newest), frame.filter(days == newest)
