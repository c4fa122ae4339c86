"""Checks a Triton export (engines/models/model_export.py) against the model as this server loads it from the
registry: the same random inputs through the served model (serving/models/kinds/towers.py, encoders.py) and
through the exported TorchScript loaded with torch.jit (the runtime Triton's libtorch backend embeds), fed
as the exported config.pbtxt declares them, in batches of several sizes (a trace must not fix the batch).

Tolerance: |exported - served| <= ATOL + RTOL * |served| elementwise (float32 kernels may order sums
differently between the eager and the TorchScript graph; the values are unit vectors or O(1) scores).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from engines.models.model_export import CONFIG_FILE, TritonModel, load_exported, parse_config
from ml.clip import preprocess_image, tokenizer
from ml.personalization import PersonalizationModel, TowerSpec

ATOL, RTOL = 1e-5, 1e-5
BATCHES = (1, 7, 24)  # the rows go through the exported model in batches of these sizes
NUMPY_OF = {"TYPE_FP32": np.float32, "TYPE_INT64": np.int64}


@dataclass(frozen=True)
class Comparison:
    model: str
    version: str
    rows: int
    max_abs_diff: float
    passed: bool
    problem: str = ""

    def row(self) -> dict:
        return {
            "triton_model": self.model,
            "version": self.version,
            "rows": self.rows,
            "max_abs_diff": f"{self.max_abs_diff:.2e}",
            "tolerance": f"{ATOL:g} + {RTOL:g}*|served|",
            "passed": self.passed,
            "problem": self.problem,
        }


def compare_export(repository: Path, model: TritonModel, folder: Path, seed: int = 0) -> Comparison:
    """`model`'s export against the served model loaded from the verified registry `folder`."""
    rng = np.random.default_rng(seed)
    rows = sum(BATCHES)
    try:
        served, inputs = _served_and_inputs(model, folder, rng, rows)
        exported = _run_exported(repository, model, inputs)
    except Exception as error:  # a broken export is a failed comparison, reported with its reason
        return Comparison(
            model.name, model.target.version, rows, float("nan"), False, f"{type(error).__name__}: {error}"
        )
    if exported.shape != served.shape:
        return Comparison(
            model.name,
            model.target.version,
            rows,
            float("nan"),
            False,
            f"exported output shape {exported.shape} != served {served.shape}",
        )
    diff = np.abs(exported.astype(np.float64) - served.astype(np.float64))
    passed = bool(np.all(diff <= ATOL + RTOL * np.abs(served)))
    return Comparison(model.name, model.target.version, rows, float(diff.max(initial=0.0)), passed)


def _served_and_inputs(model: TritonModel, folder: Path, rng, rows: int) -> tuple[np.ndarray, dict]:
    """The served model's outputs for random inputs, and the same inputs encoded for the export."""
    from serving.models.config import BatchingConfig
    from serving.models.kinds.encoders import ClipEncoder
    from serving.models.kinds.towers import ItemIndex, TwoTowerModel

    if model.part == "user_tower":
        network = PersonalizationModel.load(folder)
        columns = random_columns(network.spec.user, rng, rows)
        served = TwoTowerModel(network, None, "").user_vectors(columns)  # the server's own encoder and path
        return served, network.spec.user.encode(_frame(network.spec.user, columns))  # the training encoder
    if model.part == "item_tower":
        network = PersonalizationModel.load(folder)
        columns = random_columns(network.spec.item, rng, rows)
        items = _frame(network.spec.item, columns)
        served = ItemIndex.build(network, items).vectors  # the catalogue vectors the server scores with
        return served, network.spec.item.encode(items)
    encoder = ClipEncoder(folder, model.part, BatchingConfig())
    try:
        if model.part == "text":
            texts = [_random_text(rng) for _ in range(rows)]
            served = encoder.infer({"text": np.array([t.encode() for t in texts], dtype=object)}, {})["embedding"]
            return served, {"tokens": tokenizer(encoder.spec)(texts).numpy()}
        images = [_random_png(rng) for _ in range(rows)]
        served = encoder.infer({"image": np.array(images, dtype=object)}, {})["embedding"]
        return served, {"pixels": np.stack([preprocess_image(data, encoder.size) for data in images])}
    finally:
        encoder.close()


def _run_exported(repository: Path, model: TritonModel, inputs: dict) -> np.ndarray:
    """Feed the inputs as config.pbtxt declares them (names, types, per-row shapes) in several batch sizes."""
    from tritonclient.grpc import model_config_pb2 as mc

    config = parse_config((model.folder(repository) / CONFIG_FILE).read_text())
    declared = {spec.name for spec in config.input}
    undeclared = sorted(k for k, v in inputs.items() if k not in declared and np.asarray(v).size)
    if undeclared:
        raise ValueError(f"the encoder makes inputs {undeclared} that config.pbtxt does not declare")
    tensors = {}
    for spec in config.input:
        if spec.name not in inputs:
            raise ValueError(f"config.pbtxt declares input {spec.name!r}, which the encoder does not make")
        data_type = mc.DataType.Name(spec.data_type)
        value = np.asarray(inputs[spec.name])
        row_shape = tuple(spec.reshape.shape) if spec.HasField("reshape") else tuple(spec.dims)
        if value.shape[1:] != row_shape or value.dtype != NUMPY_OF[data_type]:
            raise ValueError(
                f"input {spec.name!r}: encoded {value.dtype}{list(value.shape[1:])}, config.pbtxt "
                f"declares {data_type}{list(row_shape)}"
            )
        tensors[spec.name] = torch.from_numpy(np.ascontiguousarray(value))
    script = load_exported(repository, model)
    towers = model.part in ("user_tower", "item_tower")  # one Dict[str, Tensor] argument; encoders one tensor
    outputs, start = [], 0
    with torch.no_grad():
        for size in BATCHES:
            batch = {k: v[start : start + size] for k, v in tensors.items()}
            outputs.append(script(batch if towers else next(iter(batch.values()))).numpy())
            start += size
    return np.concatenate(outputs)


def random_columns(spec: TowerSpec, rng, rows: int) -> dict[str, list]:
    """Feature columns as a client sends them, with what a client gets wrong: ids past the id buckets,
    missing and NaN values, unseen and missing categories, histories longer than the tower reads."""
    columns: dict[str, list] = {spec.id_column: rng.integers(0, 2 * spec.id_buckets + 5, rows).tolist()}
    for i, column in enumerate(spec.numeric):
        values = rng.normal(spec.means[i], spec.stds[i] * 2, rows).tolist()
        columns[column] = [
            None if r < 0.1 else float("nan") if r < 0.15 else v for v, r in zip(values, rng.random(rows))
        ]
    for column, known in spec.categorical.items():
        choices = [*known, "never-seen"]
        columns[column] = [
            None if r < 0.1 else choices[int(k)] for r, k in zip(rng.random(rows), rng.integers(0, len(choices), rows))
        ]
    for column in spec.histories:
        columns[column] = [rng.integers(0, 3 * spec.id_buckets + 5, int(n)).tolist() for n in rng.integers(0, 16, rows)]
    if spec.embedding_column:
        vectors = rng.normal(size=(rows, spec.embedding_dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        columns[spec.embedding_column] = [None if r < 0.1 else v.tolist() for v, r in zip(vectors, rng.random(rows))]
    return columns


def _frame(spec: TowerSpec, columns: dict[str, list]) -> pl.DataFrame:
    schema: dict[str, pl.DataType] = {
        spec.id_column: pl.Int64(),
        **{c: pl.Float64() for c in spec.numeric},
        **{c: pl.String() for c in spec.categorical},
        **{c: pl.List(pl.Int64) for c in spec.histories},
    }
    if spec.embedding_column:
        schema[spec.embedding_column] = pl.List(pl.Float32)
    return pl.DataFrame({c: columns[c] for c in schema}, schema=schema, strict=False)


def _random_text(rng) -> str:
    words = ["red", "low-poly", "castle", "robot", "car", "sword", "tree", "dragon", "ship", "chair", "neon", "ü"]
    return " ".join(rng.choice(words, int(rng.integers(0, 40))))  # longer than the context: truncated


def _random_png(rng) -> bytes:
    from PIL import Image

    size = int(rng.integers(16, 128))  # most not the model's size: resized
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()
