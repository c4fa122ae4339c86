"""Copy matching on made-up thumbnails: a disguised copy (moved a pixel, tinted, noised) finds its
original among earlier items of other creators, never itself, a later item or its own creator's."""

from datetime import datetime, timedelta

import numpy as np
import polars as pl

from engines.safety.copy_match import SIZE, match_originals


def disguised(image: np.ndarray, rng) -> np.ndarray:
    moved = np.roll(image, (1, -1), axis=(0, 1)) * (1 + rng.uniform(-0.05, 0.05, 3))
    return np.clip(moved + rng.normal(0, 4, image.shape), 0, 255).astype(np.float32)


def items(rows) -> pl.DataFrame:
    """rows: (item_id, creator_id, day); every CLIP vector the same, so the pixels alone decide."""
    start = datetime(2026, 1, 1)
    return pl.DataFrame(
        {
            "item_id": [r[0] for r in rows],
            "creator_id": [r[1] for r in rows],
            "created_at": [start + timedelta(days=r[2]) for r in rows],
            "image_embedding": [[1.0, 0.0]] * len(rows),
        },
        schema_overrides={"image_embedding": pl.List(pl.Float32)},
    )


def test_a_copy_finds_its_earlier_original_of_another_creator():
    rng = np.random.default_rng(0)
    original = rng.uniform(0, 255, (SIZE, SIZE, 3)).astype(np.float32)
    pixels = {
        1: original,  # creator 10, day 0
        2: rng.uniform(0, 255, (SIZE, SIZE, 3)).astype(np.float32),  # a lookalike by CLIP only
        3: disguised(original, rng),  # creator 20 copies 1 on day 5
        4: disguised(original, rng),  # creator 10 re-uploads its own design: not a copy of another's
        5: disguised(original, rng),  # creator 20 again, before anything: nothing earlier to match
    }
    pool = items([(1, 10, 0), (2, 30, 1), (3, 20, 5), (4, 10, 6), (5, 20, -1)])
    matches = {r["item_id"]: r for r in match_originals(pool, pool, pixels).iter_rows(named=True)}
    assert matches[3]["original_id"] == 1 and matches[3]["similarity"] > 0.98
    assert matches[3]["margin"] > 0.5 and matches[3]["days_after_original"] == 5.0
    assert matches[4]["original_id"] in (3, 5)  # its own creator's item 1 is excluded; creator 20's copies are not
    assert matches[5]["original_id"] is None and matches[5]["similarity"] is None
    assert matches[1]["original_id"] == 5  # the only earlier item of another creator
    assert matches[2]["similarity"] < 0.5  # an unrelated picture does not verify
