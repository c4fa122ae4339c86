"""The matched original beside a queued item: read from the detector's flags (the newest day's match of
each item, as of the queue's day) and the catalogue, kept in the label store, changed when the match
changes. A small lake written here: the detector itself is tested in tests/assets/test_embeddings.py."""

from __future__ import annotations

from datetime import UTC, date, datetime

import numpy as np
import polars as pl

from engines.data.lake import Lake
from engines.safety import content_violation as cv
from ground_truth import originals, queue, review
from ground_truth import sources as src
from ground_truth.db import connect
from ground_truth.originals import OriginalIn
from ground_truth.schema import ItemIn, TaskSpec

DAY1, DAY2, DAY3 = date(2026, 3, 1), date(2026, 3, 2), date(2026, 3, 3)
TASK = TaskSpec(name="violation", question="Copy?", labels=["violation", "ok"], annotators_per_item=1, gold_share=0.0)


def f32(value: float) -> float:
    """The value as the flags' float32 column stores it."""
    return float(np.float32(value))


def flags(rows: list[tuple[int, int | None, float | None]]) -> pl.DataFrame:
    frame = pl.DataFrame(rows, schema=["item_id", "original_id", "similarity"], orient="row")
    return frame.with_columns(flagged=pl.lit(True), model_version=pl.lit("v1")).cast(
        {"original_id": pl.Int64, "similarity": pl.Float32}
    )


def test_matched_originals_come_from_the_newest_flags_and_the_catalogue(tmp_path):
    lake = Lake(tmp_path)
    catalogue = pl.DataFrame(
        {
            "item_id": [1, 2, 3, 10, 11],
            "title": ["copy a", "copy b", "plain", "first a", "first b"],
            "description": [""] * 5,
            "thumbnail_path": [f"thumbnails/{i}.png" for i in (1, 2, 3, 10, 11)],
            "updated_at": [datetime(2026, 3, 1, tzinfo=UTC)] * 5,
        }
    )
    lake.write_partition("warehouse", "items", DAY1, catalogue)
    lake.write_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, DAY1, flags([(1, 10, 0.91), (2, 10, 0.5), (3, None, None)]))
    lake.write_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, DAY3, flags([(2, 11, 0.97)]))  # after the queue's day
    lake.write_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, DAY2, flags([(2, 11, 0.88)]))  # item 2 matched anew

    matched = sorted(src.matched_originals(lake, DAY2, [1, 2, 3]), key=lambda m: m.key)
    assert matched == [
        OriginalIn(
            key="1",
            original_key="10",
            original_title="first a",
            original_thumbnail="thumbnails/10.png",
            similarity=f32(0.91),
        ),
        OriginalIn(
            key="2",
            original_key="11",
            original_title="first b",
            original_thumbnail="thumbnails/11.png",
            similarity=f32(0.88),
        ),
    ]  # item 3 has no match; the day after the queue's is not read

    engine = connect(f"sqlite:///{tmp_path / 'labels.db'}")
    task = queue.create_task(engine, TASK)
    queue.add_items(engine, task, [ItemIn(key=str(i), queue="detector_flagged") for i in (1, 2, 3)])
    ids = {s.key: s.item_id for s in review.item_states(engine, task)}
    assert originals.record(engine, task, matched) == 2
    assert originals.record(engine, task, matched) == 0  # unchanged: nothing written
    assert originals.of_item(engine, ids["2"]).model_dump() == {
        "key": "11",
        "title": "first b",
        "thumbnail_url": "/media/thumbnails/11.png",
        "similarity": matched[1].similarity,
    }
    assert originals.of_item(engine, ids["3"]) is None
    later = src.matched_originals(lake, DAY3, [2])
    assert (
        originals.record(engine, task, later) == 1
        and originals.of_item(engine, ids["2"]).similarity == later[0].similarity
    )
    stranger = OriginalIn(key="99", original_key="1", original_title="", original_thumbnail=None, similarity=1.0)
    assert originals.record(engine, task, [stranger]) == 0  # not an item of the task
