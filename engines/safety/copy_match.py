"""Find the original an item copies: among the items created EARLIER by OTHER creators, the nearest by
CLIP image embedding are the candidates, and each candidate is verified on pixels.

Why two stages: CLIP embeds what an image shows (a striped blue watch), so every striped blue watch is
near every other one, while a disguised copy is the same picture moved a pixel, tinted and noised.
The verification is the thumbnails' correlation per colour channel (which a tint does not change),
the best over shifts of up to one pixel (which undoes the move): a copy scores near 1, a lookalike
drawn on its own does not. The features of an item's best match are its verified similarity, the
margin over the next-best candidate of another design (candidates near-identical to the best match are
earlier copies of the same original: a popular original's third copy is still a copy), its CLIP
similarity, how much earlier the original is, and the best verified similarity to an earlier item of
the item's own creator (a re-upload of one's own design is not a copy of another's).
Plain numpy; the vectors are the lake's item embeddings (the ones the vector index holds).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import polars as pl
from PIL import Image

CANDIDATES = 50  # nearest earlier items of other creators by CLIP image embedding, verified on pixels
OWN_CANDIDATES = 10  # nearest earlier items of the item's own creator, verified the same way
SAME_ORIGINAL = 0.9  # candidates this alike to the best match copy the same design: no rival for the margin
SIZE = 64  # thumbnails are compared at SIZE x SIZE
SHIFTS = tuple((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1))
US_PER_DAY = 86_400_000_000

MATCH_SCHEMA = {
    "item_id": pl.Int64,
    "original_id": pl.Int64,
    "similarity": pl.Float32,
    "margin": pl.Float32,
    "clip_similarity": pl.Float32,
    "days_after_original": pl.Float32,
    "own_similarity": pl.Float32,
}


def thumbnail(data: bytes) -> np.ndarray:
    """PNG/JPEG bytes -> SIZE x SIZE x 3 float32 pixels. Raises on an unreadable image."""
    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
        if image.size != (SIZE, SIZE):
            image = image.resize((SIZE, SIZE), Image.BILINEAR)
        return np.asarray(image, dtype=np.float32)


def standardized(images: np.ndarray) -> np.ndarray:
    """(n, SIZE, SIZE, 3) -> (n, SIZE*SIZE*3): each channel centred and scaled to unit norm, so that the
    dot product of two rows is their mean per-channel correlation."""
    centred = images - images.mean(axis=(1, 2), keepdims=True)
    norms = np.linalg.norm(centred, axis=(1, 2), keepdims=True)
    return (centred / np.maximum(norms, 1e-6)).reshape(len(images), -1) / np.sqrt(3)


def verified_similarity(query: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """The per-channel correlation of `query` (SIZE x SIZE x 3) with each of `candidates` (standardized
    rows), the best over shifts of the query by up to one pixel."""
    if not len(candidates):
        return np.zeros(0, np.float32)
    shifted = standardized(np.stack([np.roll(query, shift, axis=(0, 1)) for shift in SHIFTS]))
    # einsum, not a BLAS product: small products on a busy machine run far slower on BLAS threads
    return np.einsum("sd,kd->sk", shifted, candidates).max(axis=0)


class _Pool:
    """The earlier items to match against: their CLIP vectors, creators, times and standardized pixels
    (computed once per item, when first a candidate)."""

    def __init__(self, pool: pl.DataFrame, pixels: dict[int, np.ndarray]):
        pool = pool.filter(pl.col("item_id").is_in(list(pixels)))
        self.height = pool.height
        self.vectors = np.stack(pool["image_embedding"].to_numpy()).astype(np.float32) if pool.height else None
        self.ids, self.creators = pool["item_id"].to_numpy(), pool["creator_id"].to_numpy()
        self.times = pool["created_at"].dt.epoch("us").to_numpy()
        self.pixels = pixels
        self.standard: dict[int, np.ndarray] = {}

    def verified(self, query: np.ndarray, embedding: np.ndarray, eligible: np.ndarray, k: int):
        """(rows of the `k` nearest `eligible` items by CLIP, their verified similarity), best first."""
        clip = np.einsum("kd,d->k", self.vectors[eligible], embedding)
        nearest = eligible[np.argsort(-clip, kind="stable")[:k]]
        for i in nearest:
            if self.ids[i] not in self.standard:
                self.standard[self.ids[i]] = standardized(self.pixels[self.ids[i]][None])[0]
        similarity = verified_similarity(query, np.stack([self.standard[self.ids[i]] for i in nearest]))
        order = np.argsort(-similarity, kind="stable")
        return nearest[order], similarity[order]

    def alike(self, row: int, others: np.ndarray) -> np.ndarray:
        """Verified similarity of pool item `row` to each of the pool items `others` (verified already)."""
        if not len(others):
            return np.zeros(0, np.float32)
        return verified_similarity(self.pixels[self.ids[row]], np.stack([self.standard[self.ids[i]] for i in others]))


def match_originals(items: pl.DataFrame, pool: pl.DataFrame, pixels: dict[int, np.ndarray], k: int = CANDIDATES):
    """One row per item (MATCH_SCHEMA): its best verified match among the `k` nearest earlier items of
    other creators in `pool`, and its best among the nearest earlier items of its own creator
    (`own_similarity`, null without one). `items` and `pool` carry item_id, image_embedding, creator_id,
    created_at; `pixels` maps item_id to its thumbnail (`thumbnail`); an item without candidates or
    pixels gets nulls."""
    if items.is_empty():
        return pl.DataFrame(schema=MATCH_SCHEMA)
    earlier = _Pool(pool, pixels)
    times = items["created_at"].dt.epoch("us").to_numpy()
    rows = []
    for row, (item_id, embedding, creator) in enumerate(
        items.select("item_id", "image_embedding", "creator_id").iter_rows()
    ):
        before = earlier.times < times[row] if earlier.height else np.zeros(0, dtype=bool)
        others = np.flatnonzero(before & (earlier.creators != creator))
        if not len(others) or item_id not in pixels:
            rows.append({"item_id": item_id})
            continue
        embedding = np.asarray(embedding, np.float32)
        nearest, similarity = earlier.verified(pixels[item_id], embedding, others, k)
        own = np.flatnonzero(before & (earlier.creators == creator))
        own_best = earlier.verified(pixels[item_id], embedding, own, OWN_CANDIDATES)[1][0] if len(own) else None
        best = nearest[0]
        distinct = similarity[1:][earlier.alike(best, nearest[1:]) < SAME_ORIGINAL]
        rows.append(
            {
                "item_id": item_id,
                "original_id": int(earlier.ids[best]),
                "similarity": float(similarity[0]),
                "margin": float(similarity[0] - distinct[0]) if len(distinct) else None,
                "clip_similarity": float(earlier.vectors[best] @ embedding),
                "days_after_original": float((times[row] - earlier.times[best]) / US_PER_DAY),
                "own_similarity": None if own_best is None else float(own_best),
            }
        )
    return pl.DataFrame(rows, schema=MATCH_SCHEMA)


def read_thumbnails(landing: Path, catalogue: pl.DataFrame) -> dict[int, np.ndarray]:
    """item_id -> pixels of the catalogue items (item_id, thumbnail_path relative to `landing`) whose
    thumbnail is readable; the unreadable ones are left out (their embedding was skipped too)."""
    pixels = {}
    for item_id, relative in catalogue.select("item_id", "thumbnail_path").iter_rows():
        try:
            pixels[item_id] = thumbnail((landing / relative).read_bytes())
        except Exception:  # noqa: BLE001 - a corrupt or missing thumbnail has no pixels to compare
            continue
    return pixels
