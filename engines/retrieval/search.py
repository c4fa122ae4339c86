"""Multimodal item search: a text or an image query, encoded by the pipeline's CLIP model, against
the `items` collection, with payload filters (category, price range) and geometry filters (a face budget,
watertight meshes only) on the `item_geometry` feature view's current values.

A text query is hybrid: the CLIP vector search and a BM25 keyword search (engines.retrieval.keywords) on the
collection's sparse vector, fused by reciprocal rank in Qdrant, both with the same filters; so an item's
own title finds it even where the CLIP model is weak. `dense_only=True` (or an index built before the
keyword vectors) gives the CLIP search alone; an image query is always dense.

Given the CLIP version of its model (`model_version`), every query is filtered to points whose vectors that
version made, so a query is never compared with vectors of another CLIP version; an index with no vector of
the version is an error that says to re-embed."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from engines.retrieval.embeddings import COLLECTION, VERSION_FIELD
from engines.retrieval.keywords import KEYWORD_VECTOR, query_vector
from engines.retrieval.vector_store import Hit, VectorStore
from ml.clip import ClipSpec, encode_images, encode_texts, image_size, load_model, preprocess_image, tokenizer

# each branch's candidates before fusion: an item ranked low by one branch can still be fused in
FUSION_CANDIDATES = 100
# The fusion (engines.retrieval.vector_store.VectorStore.fused_search): with k 1 and the keyword list weighted 3,
# the keyword search's first item (3) stays ahead of its second (1.5) whatever CLIP says (at most 1), and
# CLIP reorders the rest; with Qdrant's default (k 2, equal weights) CLIP's noise on near-identical
# titles pushed the exact title down (docs/benchmarks.md#search-quality).
FUSION_K = 1
KEYWORD_WEIGHT = 3.0


class ItemSearch:
    """Holds the model once; each query is one encode plus one (fused) vector search."""

    def __init__(
        self,
        store: VectorStore,
        spec: ClipSpec,
        geometry: pl.DataFrame | None = None,
        collection: str = COLLECTION,
        model=None,
        model_version: str | None = None,
    ):
        self.store = store
        self.spec = spec
        self.model = model if model is not None else load_model(spec)
        self.geometry = geometry  # item_geometry's current rows (engines.retrieval.geometry_job.current_geometry)
        self.collection = collection
        self.has_keywords = KEYWORD_VECTOR in store.sparse_vectors(collection)
        self.model_version = model_version
        if model_version is not None:
            self._require_version(model_version)

    def _require_version(self, version: str) -> None:
        dim = len(encode_texts(self.model, tokenizer(self.spec)(["probe"]).numpy())[0])
        if not self.store.search(self.collection, [1.0] * dim, "image", 1, {VERSION_FIELD: version}):
            raise ValueError(
                f"the {self.collection!r} index holds no vectors of CLIP {version}: re-embed the catalogue "
                "with it (the clip_champion_sensor starts that run when the champion changes)"
            )

    def search(
        self,
        text: str | None = None,
        image: Path | bytes | None = None,
        k: int = 10,
        category: str | list[str] | None = None,
        price_min: float | None = None,
        price_max: float | None = None,
        using: str = "image",
        max_faces: int | None = None,
        watertight: bool = False,
        dense_only: bool = False,
    ) -> list[Hit]:
        """Top-k items for a text or an image query. `using` picks the stored vector the query is
        compared with: 'image' (thumbnails) or 'text' (titles). A text query is fused with the keyword
        search unless `dense_only`. `max_faces` and `watertight` keep items whose measured mesh fits
        (items with a broken or unmeasured mesh never do)."""
        if (text is None) == (image is None):
            raise ValueError("give exactly one of a text or an image query")
        filters = search_filters(category, price_min, price_max)
        if self.model_version is not None:
            filters[VERSION_FIELD] = self.model_version
        if max_faces is not None or watertight:
            allowed = self._fitting_items(max_faces, watertight)
            if not allowed:
                return []
            filters["item_id"] = allowed
        query = self._encode(text, image)
        keywords = query_vector(text) if text is not None and self.has_keywords and not dense_only else None
        if keywords is None or not keywords.indices:
            return self.store.search(self.collection, query, using=using, k=k, filters=filters)
        return self.store.fused_search(
            self.collection,
            {using: query, KEYWORD_VECTOR: keywords},
            k=k,
            filters=filters,
            candidates=max(FUSION_CANDIDATES, k),
            weights={KEYWORD_VECTOR: KEYWORD_WEIGHT},
            rrf_k=FUSION_K,
        )

    def _encode(self, text: str | None, image: Path | bytes | None):
        """The CLIP embedding of the text or the image query."""
        if text is not None:
            if not text.strip():
                raise ValueError("the text query is empty")
            return encode_texts(self.model, tokenizer(self.spec)([text]).numpy())[0]
        data = Path(image).read_bytes() if isinstance(image, str | Path) else image
        try:
            pixels = preprocess_image(data, image_size(self.model))
        except Exception as error:
            raise ValueError(f"the query image cannot be decoded: {error}") from error
        return encode_images(self.model, pixels[None])[0]

    def _fitting_items(self, max_faces: int | None, watertight: bool) -> list[int]:
        if self.geometry is None:
            raise ValueError("geometry filters need the item_geometry feature view: none was given")
        if max_faces is not None and max_faces < 1:
            raise ValueError(f"max_faces must be at least 1, got {max_faces}")
        fits = pl.col("face_count").is_not_null()
        if max_faces is not None:
            fits &= pl.col("face_count") <= max_faces
        if watertight:
            fits &= pl.col("is_watertight").fill_null(False)
        return self.geometry.filter(fits)["item_id"].to_list()


def search_filters(category: str | list[str] | None, price_min: float | None, price_max: float | None) -> dict:
    filters: dict = {}
    if category:
        filters["category"] = category
    price = {k: v for k, v in (("gte", price_min), ("lte", price_max)) if v is not None}
    if price:
        filters["price"] = price
    return filters
