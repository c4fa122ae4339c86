"""The personalization two-tower model as a served model: the user tower's feature columns in as named
tensors, the user vector out; with `item_ids`, each user's scores of those items (the same dot product
the model was trained with, against item vectors computed once when the version loads)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from engines.data.lake import Lake
from engines.models.batch_inference import entity_features
from ml.personalization import UNSEEN, PersonalizationModel, TowerSpec, TwoTower
from serving.models.kinds.base import ServedModel
from serving.models.protocols.protocol import ProtocolError, TensorSpec

HISTORY_PAD = -1  # histories travel as (N, L) INT64 padded with -1
HISTORY_LENGTH = 10  # the newest ids of a history the tower reads (ml.personalization._padded_ids)
# a request of up to this many input values is answered on the event loop: the numpy tower takes
# tens of microseconds there, less than the hop to a worker thread and back; larger ones go to a thread
INLINE_VALUES = 2048


@dataclass
class ItemIndex:
    """Every catalogue item's tower vector, rows in item-id order."""

    item_ids: np.ndarray
    vectors: np.ndarray
    row_of: dict[int, int]

    @classmethod
    def build(cls, model: PersonalizationModel, items: pl.DataFrame) -> ItemIndex:
        ids = items.get_column("item_id").to_numpy()
        vectors = model.item_vectors(items).astype(np.float32) if items.height else np.zeros((0, 1), np.float32)
        return cls(ids, vectors, {int(i): r for r, i in enumerate(ids)})

    def rows(self, item_ids: np.ndarray) -> np.ndarray:
        unknown = sorted({int(i) for i in item_ids.reshape(-1)} - self.row_of.keys())
        if unknown:
            raise ProtocolError(400, f"unknown item id(s) {unknown[:10]}: not in the catalogue this version indexed")
        return (
            np.vectorize(self.row_of.__getitem__, otypes=[np.int64])(item_ids)
            if item_ids.size
            else item_ids.astype(np.int64)
        )


class UserEncoder:
    """The user tower's inputs straight from column values, as numpy arrays (what TowerSpec.encode
    computes from a polars frame, without a frame: the per-column polars calls cost ~1 ms each on the
    request path). The protocol tests compare the two paths' vectors."""

    def __init__(self, spec: TowerSpec):
        self.spec = spec
        self.means = np.asarray(spec.means, np.float64)
        self.stds = np.asarray(spec.stds, np.float64)
        self.indexes = {c: {v: k + 1 for k, v in enumerate(values)} for c, values in spec.categorical.items()}

    def encode(self, columns: dict[str, list]) -> dict[str, np.ndarray]:
        spec = self.spec
        ids = spec.buckets(np.asarray(columns[spec.id_column], dtype=np.int64))
        rows = len(ids)
        numeric = np.zeros((rows, len(spec.numeric)), np.float64)
        for i, column in enumerate(spec.numeric):
            numeric[:, i] = [0.0 if v is None else float(v) for v in columns[column]]
        numeric = np.nan_to_num(numeric, nan=0.0, posinf=np.inf, neginf=-np.inf)
        for i, column in enumerate(spec.numeric):
            numeric[:, i] = spec.scale(column, numeric[:, i])
        numeric = (
            ((numeric - self.means) / self.stds).astype(np.float32) if spec.numeric else numeric.astype(np.float32)
        )
        categorical = np.zeros((rows, len(spec.categorical)), np.int64)
        for i, column in enumerate(spec.categorical):
            index = self.indexes[column]
            categorical[:, i] = [0 if v is None else index.get(str(v), 0) for v in columns[column]]
        inputs = {"ids": ids, "numeric": numeric, "categorical": categorical}
        for i, column in enumerate(spec.histories):
            matrix = np.zeros((rows, HISTORY_LENGTH), np.int64)
            for row, items in enumerate(columns[column]):
                if items:
                    items = list(items)[-HISTORY_LENGTH:]
                    matrix[row, : len(items)] = np.asarray(items, np.int64) + 1
            inputs[f"history{i}"] = matrix
        return inputs


MIXTURE_BUFFERS = (
    "taste_position",
    "taste_mean",
    "taste_std",
    "taste_log",
    "log_prior",
    "log_exposure",
    "log_propensity",
    "log_unclicked",
    "expected",
)


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


class UserTowerKernel:
    """The user tower's forward pass (ml.personalization.Tower, then TwoTower.user_vectors' constant 1)
    in numpy over the version's own weights: for the few rows of a request, torch's per-operation
    dispatch costs several times the arithmetic. Same float32 operations in the same order; the tests
    compare it with the torch network."""

    def __init__(self, network: TwoTower):
        tower = network.user_tower

        def weights(module) -> np.ndarray:
            return module.weight.detach().cpu().numpy().astype(np.float32)

        self.ids = weights(tower.ids)
        self.categories = [weights(e) for e in tower.categories]
        self.histories = tower.histories
        self.items = weights(tower.item_ids) if tower.histories else None
        self.history_categories = tower.categories_of_history
        if self.history_categories:
            self.item_category = tower.item_category.detach().cpu().numpy()
        first, second = tower.mlp[0], tower.mlp[2]
        self.w1, self.b1 = np.ascontiguousarray(weights(first).T), first.bias.detach().cpu().numpy()
        self.w2, self.b2 = np.ascontiguousarray(weights(second).T), second.bias.detach().cpu().numpy()
        self.direct = weights(tower.direct)  # each id's own output vector, added after the MLP
        # the taste head: a score per item category from the inputs, plus the taste-cluster mixture's term
        self.taste = (
            None if tower.taste is None else (np.ascontiguousarray(weights(tower.taste).T), _array(tower.taste.bias))
        )
        self.mixture = {name: _array(getattr(tower, name)) for name in MIXTURE_BUFFERS} if tower.mixture else None
        self.cluster_weight = 1.0 + float(tower.cluster_weight.detach().cpu()) if tower.mixture else 0.0

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        parts = [self.ids[inputs["ids"]], inputs["numeric"]]
        parts += [table[inputs["categorical"][:, i]] for i, table in enumerate(self.categories)]
        for i in range(self.histories):
            ids = inputs[f"history{i}"]  # item id + 1, 0 pads
            present = (ids > 0)[..., None].astype(np.float32)
            known = (ids > 0) & (ids < len(self.items) + 1)  # else the unseen bucket, as in training
            buckets = np.where(known, ids - 1, UNSEEN)
            vectors = self.items[buckets] * present
            parts.append(vectors.sum(axis=1) / np.maximum(present.sum(axis=1), 1.0))
            if self.history_categories:  # the shares of each category among the history's items
                counts = np.eye(self.history_categories, dtype=np.float32)[self.item_category[buckets]] * present
                parts.append(counts.sum(axis=1) / np.maximum(present.sum(axis=1), 1.0))
        if "embedding" in inputs:
            parts.append(inputs["embedding"])
        mixture = self.cluster_taste(inputs["numeric"]) if self.mixture else None
        if mixture is not None:
            parts.append(mixture)
        features = np.concatenate(parts, axis=1)
        hidden = np.maximum(features @ self.w1 + self.b1, 0.0)
        out = [hidden @ self.w2 + self.b2 + self.direct[inputs["ids"]]]
        if self.taste is not None:
            taste = features @ self.taste[0] + self.taste[1]
            out.append(taste if mixture is None else taste + np.float32(self.cluster_weight) * mixture)
        out.append(np.ones((len(features), 1), np.float32))
        return np.concatenate(out, axis=1)

    def cluster_taste(self, numeric: np.ndarray) -> np.ndarray:
        """ml.personalization.Tower.cluster_taste in numpy."""
        m = self.mixture
        position = m["taste_position"]
        scaled = numeric[:, np.maximum(position, 0)] * m["taste_std"] + m["taste_mean"]
        counts = np.where(m["taste_log"], np.expm1(scaled), scaled)
        counts = np.maximum(np.where(position >= 0, counts, 0.0), 0.0).astype(np.float32)
        categories = m["expected"].shape[1]
        shown = counts[:, :categories]
        clicked = np.minimum(counts[:, categories:], shown)
        joint = (
            m["log_prior"]
            + shown @ m["log_exposure"].T
            + clicked @ m["log_propensity"].T
            + (shown - clicked) @ m["log_unclicked"].T
        )
        joint = np.exp(joint - joint.max(axis=1, keepdims=True))
        expected = np.log((joint / joint.sum(axis=1, keepdims=True)) @ m["expected"])
        return np.concatenate([expected.mean(axis=1, keepdims=True), expected], axis=1).astype(np.float32)


class TwoTowerModel(ServedModel):
    platform = "pytorch_two_tower"

    def __init__(self, model: PersonalizationModel, items: ItemIndex | None, feature_service: str):
        self.model = model
        self.items = items
        self.feature_service = feature_service
        self.encoder = UserEncoder(model.spec.user)
        self.kernel = UserTowerKernel(model.network)
        spec = model.spec.user
        self.inputs = [
            TensorSpec(spec.id_column, "INT64", (-1,)),
            *[TensorSpec(c, "FP64", (-1,)) for c in spec.numeric],
            *[TensorSpec(c, "BYTES", (-1,)) for c in spec.categorical],
            *[TensorSpec(c, "INT64", (-1, -1)) for c in spec.histories],
            TensorSpec("item_ids", "INT64", (-1, -1), optional=True),
        ]
        dim = model.spec.vector_dim
        self.outputs = [TensorSpec("user_vector", "FP32", (-1, dim)), TensorSpec("item_scores", "FP32", (-1, -1))]

    def parameters(self) -> dict:
        return {
            "feature_service": self.feature_service,
            "catalogue_items": 0 if self.items is None else len(self.items.item_ids),
        }

    async def infer_async(self, inputs: dict[str, np.ndarray], parameters: dict) -> dict[str, np.ndarray]:
        if sum(a.size for a in inputs.values()) <= INLINE_VALUES:
            return self.infer(inputs, parameters)
        return await super().infer_async(inputs, parameters)

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict) -> dict[str, np.ndarray]:
        spec = self.model.spec.user
        rows = {len(a) for a in inputs.values()}
        if len(rows) > 1:
            raise ProtocolError(400, f"inputs disagree on the batch size (first dimension): {sorted(rows)}")
        columns: dict[str, list] = {spec.id_column: inputs[spec.id_column].tolist()}
        for c in spec.numeric:
            columns[c] = inputs[c].tolist()
        for c in spec.categorical:
            columns[c] = [v.decode(errors="replace") for v in inputs[c].tolist()]
        for c in spec.histories:
            columns[c] = [[i for i in row if i != HISTORY_PAD] for row in inputs[c].tolist()]
        vectors = self.user_vectors(columns)
        out = {"user_vector": vectors}
        if "item_ids" in inputs:
            out["item_scores"] = self.item_scores(vectors, inputs["item_ids"])
        return out

    def user_vectors(self, columns: dict[str, list]) -> np.ndarray:
        """User vectors from column -> values (a column absent is all missing)."""
        rows = len(columns[self.model.spec.user.id_column])
        full = {c: columns.get(c, [None] * rows) for c in self.model.spec.user.columns}
        return self.kernel(self.encoder.encode(full)).astype(np.float32, copy=False)

    def torch_user_vectors(self, columns: dict[str, list]) -> np.ndarray:
        """The same through the torch network (what the kernel is checked against)."""
        rows = len(columns[self.model.spec.user.id_column])
        full = {c: columns.get(c, [None] * rows) for c in self.model.spec.user.columns}
        inputs = {name: torch.from_numpy(array) for name, array in self.encoder.encode(full).items()}
        with torch.inference_mode():
            return self.model.network.user_vectors(inputs).numpy().astype(np.float32)

    def item_scores(self, user_vectors: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
        if self.items is None:
            raise ProtocolError(
                503,
                "item scores need the item catalogue, which was not found when this version "
                "loaded (no offline item features in the lake)",
            )
        if len(item_ids) != len(user_vectors):
            raise ProtocolError(400, f"item_ids has {len(item_ids)} rows, the users {len(user_vectors)}")
        vectors = self.items.vectors[self.items.rows(item_ids)]  # (N, M, vector_dim)
        return np.einsum("nd,nmd->nm", user_vectors, vectors).astype(np.float32)


def load_two_tower(folder: Path, lake: Lake, feature_service: str) -> tuple[TwoTowerModel, pl.DataFrame | None]:
    """The served model and the catalogue rows its item vectors came from (None: no catalogue)."""
    model = PersonalizationModel.load(folder)
    items = catalogue_rows(lake, model)
    index = ItemIndex.build(model, items) if items is not None else None
    return TwoTowerModel(model, index, feature_service), items


def catalogue_rows(lake: Lake, model: PersonalizationModel) -> pl.DataFrame | None:
    """The item tower's rows of every item on the newest day every one of its offline views has
    (None when the lake has none), with CLIP embeddings where the model was trained with them."""
    from engines.features.point_in_time import item_embeddings_as_of
    from engines.models.batch_inference import existing_items
    from engines.retrieval.embeddings import EMBEDDINGS_ZONE, ITEMS_TABLE

    views = {c.split("__", 1)[0] for c in model.spec.item.columns if "__" in c}
    days = [set(lake.partition_days("offline", v)) for v in views]
    common = set.intersection(*days) if days else set()
    if not common or not lake.partition_days("warehouse", "items"):
        return None
    day = max(common)
    # the item rows batch inference scores: features and CLIP embeddings as of the newest day's end
    rows = entity_features(lake, day, model.spec.item.columns, "item_id", sorted(existing_items(lake, day))).frame
    if model.spec.item.embedding_column:
        if not lake.partition_days(EMBEDDINGS_ZONE, ITEMS_TABLE):
            raise ValueError("this version was trained with CLIP item embeddings and the lake has none")
        rows = item_embeddings_as_of(lake.root, rows)
    return rows
