"""CLIP from the registry as served models: text and image encoders (dynamic batching joins concurrent
requests into one encoder call) and the content-violation scorer (an image's verified similarity to the
catalogue item it may copy, the catalogue embedded by the same CLIP version when it loads).

A registered CLIP version is a folder holding `clip.pt` (open_clip state dict) and `clip.json`
(the open_clip config name), written by the `models/clip` asset.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl
from starlette.concurrency import run_in_threadpool

from engines.data.lake import Lake
from engines.safety import content_violation as cv
from engines.safety import copy_match
from engines.safety.copy_calibration import Calibration
from ml.clip import (
    ClipSpec,
    ImageTooLarge,
    encode_images,
    encode_texts,
    image_size,
    load_model,
    preprocess_image,
    tokenizer,
)
from serving.models.kinds.base import DynamicBatcher, ServedModel
from serving.models.protocols.protocol import ProtocolError, TensorSpec

WEIGHTS_FILE = "clip.pt"
CONFIG_FILE = "clip.json"
POOL_SCHEMA = {
    "item_id": pl.Int64,
    "creator_id": pl.Int64,
    "created_at": pl.Datetime("us"),
    "image_embedding": pl.List(pl.Float32),
}


def clip_spec(folder: Path) -> ClipSpec:
    config = json.loads((folder / CONFIG_FILE).read_text())
    return ClipSpec(config["model_name"], str(folder / WEIGHTS_FILE))


class ClipEncoder(ServedModel):
    platform = "pytorch_open_clip"

    def __init__(
        self, folder: Path, modality: str, batching, device: str = "cpu", on_batch=None, max_pixels: int | None = None
    ):
        import torch

        torch.set_num_threads(1)
        self.spec = clip_spec(folder)
        self.device = device
        self.model = load_model(self.spec, device=device)
        self.modality = modality
        self.max_pixels = max_pixels
        self.size = image_size(self.model)
        dim = int(self.model.text_projection.shape[1]) if modality == "text" else int(self.model.visual.output_dim)
        self.inputs = [TensorSpec(modality, "BYTES", (-1,))]
        self.outputs = [TensorSpec("embedding", "FP32", (-1, dim))]
        encode = self._encode_texts if modality == "text" else self._encode_images
        self.batcher = DynamicBatcher(encode, batching.max_batch, batching.max_delay_ms, on_batch)

    def parameters(self) -> dict:
        return {"open_clip_model": self.spec.model_name, "image_size": self.size}

    def _encode_texts(self, tokens: np.ndarray) -> np.ndarray:
        return encode_texts(self.model, tokens, self.device)

    def _encode_images(self, pixels: np.ndarray) -> np.ndarray:
        return encode_images(self.model, pixels, self.device)

    def prepare(self, values: np.ndarray) -> np.ndarray:
        """Tokens or preprocessed pixels of the request's rows (a bad image is the client's 400)."""
        if self.modality == "text":
            texts = [v.decode(errors="replace") for v in values.tolist()]
            return tokenizer(self.spec)(texts).numpy()
        pixels = []
        for i, data in enumerate(values.tolist()):
            try:
                pixels.append(preprocess_image(data, self.size, self.max_pixels))
            except ImageTooLarge as error:
                raise ProtocolError(413, f"input 'image'[{i}]: {error} (max_image_pixels)") from error
            except Exception as error:
                raise ProtocolError(400, f"input 'image'[{i}] is not a readable PNG/JPEG image: {error}") from error
        return np.stack(pixels) if pixels else np.zeros((0, 3, self.size, self.size), np.float32)

    def infer(self, inputs, parameters):
        rows = self.prepare(inputs[self.modality])
        encode = self._encode_texts if self.modality == "text" else self._encode_images
        return {"embedding": encode(rows)}

    async def infer_async(self, inputs, parameters):
        rows = await run_in_threadpool(self.prepare, inputs[self.modality])  # tokenizing, decoding: off the loop
        if not len(rows):
            return {"embedding": np.zeros((0, self.outputs[0].shape[1]), np.float32)}
        return {"embedding": await self.batcher.submit(rows)}

    def close(self) -> None:
        self.batcher.close()


class ContentViolationScorer(ServedModel):
    """Copy detection for one image: its best verified match among the catalogue's items
    (`engines.safety.copy_match`, as the batch flags), scored by the batch job's copy model and flagged at its
    calibrated threshold. Parameter
    `item_id` scores the image as that catalogue item (only earlier items of other creators count, as in
    the batch flags); without it every catalogue item is an earlier item of another creator."""

    platform = "pytorch_open_clip"

    def __init__(
        self,
        folder: Path,
        lake: Lake,
        batching,
        device: str = "cpu",
        on_batch=None,
        max_pixels: int | None = None,
        detector: tuple[Calibration, str] | None = None,
    ):
        """`detector`: the copy_detector's calibration and its registry version (the batch flags' model and
        threshold, engines.safety.copy_registry.newest_calibration); None: no release calibrated one yet, and
        nothing is flagged."""
        from engines.retrieval.embeddings import catalogue_images, current_catalogue

        self.encoder = ClipEncoder(folder, "image", batching, device, on_batch, max_pixels)
        catalogue = current_catalogue(lake)
        items, pixels = (
            catalogue_images(lake.root / "landing", catalogue, self.encoder.size)
            if catalogue.height
            else (catalogue, None)
        )
        embeddings = encode_images(self.encoder.model, pixels, device) if items.height else np.zeros((0, 0))
        self.pool = (
            items.select("item_id", "creator_id", "created_at").with_columns(
                image_embedding=pl.Series(embeddings.tolist(), dtype=pl.List(pl.Float32))
            )
            if items.height
            else pl.DataFrame(schema=POOL_SCHEMA)
        )
        self.pixels = copy_match.read_thumbnails(lake.root / "landing", items) if items.height else {}
        self.calibration, self.detector_version = detector if detector else (None, None)
        self.threshold = self.calibration.threshold if self.calibration else None
        self.release = self.calibration.release if self.calibration else None
        self.inputs = [TensorSpec("image", "BYTES", (-1,))]
        self.outputs = [
            TensorSpec("similarity", "FP32", (-1,)),
            TensorSpec("score", "FP32", (-1,)),
            TensorSpec("flagged", "BOOL", (-1,)),
            TensorSpec("original_id", "INT64", (-1,)),
        ]

    def parameters(self) -> dict:
        return {
            "catalogue_items": len(self.pixels),
            "threshold": self.threshold,
            "calibrated_on": self.release,
            "copy_detector_version": self.detector_version,
        }

    def queries(self, images: np.ndarray, embeddings: np.ndarray, parameters: dict) -> pl.DataFrame:
        """The images as items to match: as catalogue item `item_id` when given, else as new items of an
        unknown creator (ids -1, -2, ...)."""
        item_id = parameters.get("item_id")
        if item_id is not None:
            if not isinstance(item_id, int) or isinstance(item_id, bool):
                raise ProtocolError(400, f"parameter 'item_id' must be a catalogue item's integer id, got {item_id!r}")
            row = self.pool.filter(pl.col("item_id") == item_id)
            if row.is_empty():
                raise ProtocolError(400, f"parameter 'item_id': no catalogue item {item_id}")
            creator, created = row["creator_id"][0], row["created_at"][0]
        else:
            creator, created = None, datetime.max
        return pl.DataFrame(
            {
                "item_id": [-(i + 1) for i in range(len(images))],
                "image_embedding": embeddings.tolist(),
                "creator_id": [creator] * len(images),
                "created_at": [created] * len(images),
            },
            schema_overrides={"image_embedding": pl.List(pl.Float32)},
        )

    def score(self, images: np.ndarray, embeddings: np.ndarray, parameters: dict) -> dict[str, np.ndarray]:
        pixels = dict(self.pixels)
        for i, data in enumerate(images.tolist()):
            pixels[-(i + 1)] = copy_match.thumbnail(data)  # readable: the encoder has decoded it
        queries = self.queries(images, embeddings, parameters)
        flags = cv.scored(copy_match.match_originals(queries, self.pool, pixels), self.calibration)
        return {
            "similarity": flags["similarity"].fill_null(float("nan")).to_numpy().astype(np.float32),
            "score": flags["score"].fill_null(float("nan")).to_numpy().astype(np.float32),
            "flagged": flags["flagged"].to_numpy().astype(bool),
            "original_id": flags["original_id"].fill_null(-1).to_numpy().astype(np.int64),
        }

    def infer(self, inputs, parameters):
        return self.score(inputs["image"], self.encoder.infer(inputs, parameters)["embedding"], parameters)

    async def infer_async(self, inputs, parameters):
        embeddings = (await self.encoder.infer_async(inputs, parameters))["embedding"]
        return await run_in_threadpool(self.score, inputs["image"], embeddings, parameters)

    def close(self) -> None:
        self.encoder.close()
