"""CLIP from the registry as served models: text and image encoders (dynamic batching joins concurrent
requests into one encoder call) and the content-violation scorer (an image's highest cosine similarity
to the known-violating reference items, embedded by the same CLIP version when it loads).

A registered CLIP version is a folder holding `clip.pt` (open_clip state dict) and `clip.json`
(the open_clip config name), written by the `models/clip` asset.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from engines import content_violation as cv
from engines.lake import Lake
from ml.clip import ClipSpec, encode_images, encode_texts, image_size, load_model, preprocess_image, tokenizer
from serving.models.base import DynamicBatcher, ServedModel
from serving.models.protocol import ProtocolError, TensorSpec

WEIGHTS_FILE = "clip.pt"
CONFIG_FILE = "clip.json"


def clip_spec(folder: Path) -> ClipSpec:
    config = json.loads((folder / CONFIG_FILE).read_text())
    return ClipSpec(config["model_name"], str(folder / WEIGHTS_FILE))


class ClipEncoder(ServedModel):
    platform = "pytorch_open_clip"

    def __init__(self, folder: Path, modality: str, batching, device: str = "cpu", on_batch=None):
        import torch

        torch.set_num_threads(1)
        self.spec = clip_spec(folder)
        self.device = device
        self.model = load_model(self.spec, device=device)
        self.modality = modality
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
                pixels.append(preprocess_image(data, self.size))
            except Exception as error:
                raise ProtocolError(400, f"input 'image'[{i}] is not a readable PNG/JPEG image: {error}") from error
        return np.stack(pixels) if pixels else np.zeros((0, 3, self.size, self.size), np.float32)

    def infer(self, inputs, parameters):
        rows = self.prepare(inputs[self.modality])
        encode = self._encode_texts if self.modality == "text" else self._encode_images
        return {"embedding": encode(rows)}

    async def infer_async(self, inputs, parameters):
        rows = self.prepare(inputs[self.modality])
        if not len(rows):
            return {"embedding": np.zeros((0, self.outputs[0].shape[1]), np.float32)}
        return {"embedding": await self.batcher.submit(rows)}

    def close(self) -> None:
        self.batcher.close()


class ContentViolationScorer(ServedModel):
    platform = "pytorch_open_clip"

    def __init__(self, folder: Path, lake: Lake, batching, device: str = "cpu", on_batch=None):
        from engines.embeddings import catalogue_images, current_catalogue

        self.encoder = ClipEncoder(folder, "image", batching, device, on_batch)
        # the confirmed violations of the newest ground-truth release, as the batch flags use; before the
        # first release there are none and nothing is flagged
        truth = cv.release_truth(lake.root)
        self.threshold = cv.DEFAULT_THRESHOLD  # the flags asset's calibrated one is passed as a parameter
        references = current_catalogue(lake).filter(pl.col("item_id").is_in(truth.references if truth else []))
        items, pixels = catalogue_images(lake.root / "landing", references, self.encoder.size)
        if references.height and items.is_empty():
            raise ValueError("none of the reference items has a readable thumbnail in the lake")
        embeddings = encode_images(self.encoder.model, pixels, device) if items.height else np.zeros((0, 0))
        self.references = pl.DataFrame(
            {"item_id": items["item_id"], "image_embedding": embeddings.tolist()},
            schema={"item_id": pl.Int64, "image_embedding": pl.List(pl.Float32)},
        )
        self.inputs = [TensorSpec("image", "BYTES", (-1,))]
        self.outputs = [
            TensorSpec("similarity", "FP32", (-1,)),
            TensorSpec("flagged", "BOOL", (-1,)),
            TensorSpec("nearest_reference_id", "INT64", (-1,)),
        ]

    def parameters(self) -> dict:
        return {"references": self.references.height, "default_threshold": self.threshold}

    def score(self, embeddings: np.ndarray, parameters: dict) -> dict[str, np.ndarray]:
        threshold = parameters.get("threshold", self.threshold)
        if not isinstance(threshold, int | float) or isinstance(threshold, bool) or not -1 <= threshold <= 1:
            raise ProtocolError(400, f"parameter 'threshold' must be a number in [-1, 1], got {threshold!r}")
        frame = pl.DataFrame(
            {
                "item_id": [-1] * len(embeddings),
                "image_embedding": embeddings.tolist(),
                "model_version": [""] * len(embeddings),
            },
            schema={"item_id": pl.Int64, "image_embedding": pl.List(pl.Float32), "model_version": pl.String},
        )
        flags = cv.flag_items(frame, self.references, float(threshold))  # the batch flags' own scoring
        return {
            "similarity": flags["similarity"].fill_null(float("nan")).to_numpy().astype(np.float32),
            "flagged": flags["flagged"].to_numpy().astype(bool),
            "nearest_reference_id": flags["nearest_reference_id"].fill_null(-1).to_numpy().astype(np.int64),
        }

    def infer(self, inputs, parameters):
        return self.score(self.encoder.infer(inputs, parameters)["embedding"], parameters)

    async def infer_async(self, inputs, parameters):
        embeddings = (await self.encoder.infer_async(inputs, parameters))["embedding"]
        return self.score(embeddings, parameters)

    def close(self) -> None:
        self.encoder.close()
