"""Item search as a served model (kind `item_search`): `mlplane search`'s hybrid search (engines.retrieval.search)
behind the Open Inference Protocol. When a CLIP version loads, the current catalogue is embedded by that
version and indexed with its keyword vectors in a collection of its own, so a query is never compared
with vectors of another CLIP version; the index lives in the version's download folder (embedded engine)
or on the Qdrant server, and goes with the version.

Input `text` (BYTES, one query per row); parameters `k` (default 10), `category`, `price_min`,
`price_max`, `dense_only`. Outputs `item_id` (INT64) and `score` (FP32), (rows, k), padded with -1 and NaN
where fewer items match.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import polars as pl

from engines.data.lake import Lake
from engines.retrieval.embeddings import catalogue_images, current_catalogue, sync_vector_store
from engines.retrieval.search import ItemSearch
from engines.retrieval.vector_store import VectorStore
from ml.clip import encode_images, encode_texts, image_size, load_model, tokenizer
from serving.models.kinds.base import ServedModel
from serving.models.kinds.encoders import clip_spec
from serving.models.protocols.protocol import ProtocolError, TensorSpec

DEFAULT_K = 10
MAX_K = 100


class ItemSearchModel(ServedModel):
    platform = "pytorch_open_clip"

    def __init__(self, folder: Path, lake: Lake, location: str, version: str):
        spec = clip_spec(folder)
        model = load_model(spec)
        self.collection = f"items-clip-v{version}"
        self.store = VectorStore.open(location)
        self.items = index_catalogue(self.store, self.collection, lake, model, spec)
        self.search = ItemSearch(self.store, spec, collection=self.collection, model=model)
        self._lock = threading.Lock()  # the embedded engine is one process's, not every thread's at once
        self.inputs = [TensorSpec("text", "BYTES", (-1,))]
        self.outputs = [TensorSpec("item_id", "INT64", (-1, -1)), TensorSpec("score", "FP32", (-1, -1))]

    def parameters(self) -> dict:
        return {"catalogue_items": self.items, "collection": self.collection, "hybrid": self.search.has_keywords}

    def infer(self, inputs, parameters):
        k = parameters.get("k", DEFAULT_K)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise ProtocolError(400, f"parameter 'k' must be an integer from 1 to {MAX_K}, got {k!r}")
        filters = {p: parameters.get(p) for p in ("category", "price_min", "price_max")}
        ids, scores = np.full((len(inputs["text"]), k), -1, np.int64), np.full((len(inputs["text"]), k), np.nan)
        for row, value in enumerate(inputs["text"].tolist()):
            try:
                with self._lock:
                    hits = self.search.search(
                        text=value.decode(errors="replace"),
                        k=k,
                        dense_only=bool(parameters.get("dense_only", False)),
                        **filters,
                    )
            except ValueError as error:
                raise ProtocolError(400, f"input 'text'[{row}]: {error}") from error
            ids[row, : len(hits)] = [int(h.payload["item_id"]) for h in hits]
            scores[row, : len(hits)] = [h.score for h in hits]
        return {"item_id": ids, "score": scores.astype(np.float32)}

    def close(self) -> None:
        self.store.close()


def index_catalogue(store: VectorStore, collection: str, lake: Lake, model, spec) -> int:
    """Embed the current catalogue's thumbnails and titles with `model` and index them (dense and keyword
    vectors) into `collection`; the number of items indexed."""
    catalogue = current_catalogue(lake)
    if catalogue.is_empty():
        return 0
    items, pixels = catalogue_images(lake.root / "landing", catalogue, image_size(model))
    titled = (items["title"].fill_null("").str.strip_chars() != "").to_numpy()  # as the pipeline skips them
    items, pixels = items.filter(titled), pixels[titled]
    if items.is_empty():
        return 0
    embeddings = pl.DataFrame(
        {
            "item_id": items["item_id"],
            "image_embedding": encode_images(model, pixels).tolist(),
            "text_embedding": encode_texts(model, tokenizer(spec)(items["title"].to_list()).numpy()).tolist(),
        },
        schema_overrides={"image_embedding": pl.List(pl.Float32), "text_embedding": pl.List(pl.Float32)},
    )
    sync_vector_store(store, embeddings, catalogue, collection=collection)
    return embeddings.height
