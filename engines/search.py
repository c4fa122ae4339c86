"""Multimodal item search: a text or an image query, encoded by the pipeline's CLIP model, against
the `items` collection, with payload filters (category, price range) and geometry filters (a face budget,
watertight meshes only) on the `item_geometry` feature view's current values."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from engines.embeddings import COLLECTION
from engines.vector_store import Hit, VectorStore
from ml.clip import ClipSpec, encode_images, encode_texts, image_size, load_model, preprocess_image, tokenizer


class ItemSearch:
    """Holds the model once; each query is one encode plus one vector search."""

    def __init__(self, store: VectorStore, spec: ClipSpec, geometry: pl.DataFrame | None = None):
        self.store = store
        self.spec = spec
        self.model = load_model(spec)
        self.geometry = geometry  # item_geometry's current rows (engines.geometry_job.current_geometry)

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
    ) -> list[Hit]:
        """Top-k items for a text or an image query. `using` picks the stored vector the query is
        compared with: 'image' (thumbnails) or 'text' (titles). `max_faces` and `watertight` keep items
        whose measured mesh fits (items with a broken or unmeasured mesh never do)."""
        if (text is None) == (image is None):
            raise ValueError("give exactly one of a text or an image query")
        filters = search_filters(category, price_min, price_max)
        if max_faces is not None or watertight:
            allowed = self._fitting_items(max_faces, watertight)
            if not allowed:
                return []
            filters["item_id"] = allowed
        if text is not None:
            if not text.strip():
                raise ValueError("the text query is empty")
            query = encode_texts(self.model, tokenizer(self.spec)([text]).numpy())[0]
        else:
            data = Path(image).read_bytes() if isinstance(image, str | Path) else image
            try:
                pixels = preprocess_image(data, image_size(self.model))
            except Exception as error:
                raise ValueError(f"the query image cannot be decoded: {error}") from error
            query = encode_images(self.model, pixels[None])[0]
        return self.store.search(COLLECTION, query, using=using, k=k, filters=filters)

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
