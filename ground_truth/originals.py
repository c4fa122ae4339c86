"""The original a queued item may copy: the copy detector's match (the earlier item of another creator
it resembles most, with their similarity), kept beside the item so the annotator judges the two side
by side. Its own table in the label store; the media route serves an original's thumbnail only as part
of a queued item the caller may see."""

from __future__ import annotations

import time

from pydantic import BaseModel
from sqlalchemy import Column, Float, ForeignKey, Integer, MetaData, String, Table, Text, exists, select
from sqlalchemy.engine import Engine

from ground_truth.db import items
from ground_truth.queue import Task

metadata = MetaData()

item_originals = Table(
    "gt_item_originals",
    metadata,
    Column("item_id", Integer, ForeignKey(items.c.id), primary_key=True),
    Column("original_key", String(128), nullable=False),
    Column("original_title", Text, nullable=False),
    Column("original_thumbnail", String(300), index=True),
    Column("similarity", Float, nullable=False),
)


class OriginalIn(BaseModel):
    """A match as the queue's source hands it over: the item's key and its original's."""

    key: str
    original_key: str
    original_title: str
    original_thumbnail: str | None
    similarity: float


class Original(BaseModel):
    """What the annotator sees of the original beside the item."""

    key: str
    title: str
    thumbnail_url: str | None
    similarity: float


def create_table(engine: Engine) -> None:
    metadata.create_all(engine)


def record(engine: Engine, task: Task, matches: list[OriginalIn]) -> int:
    """Keep each queued item's newest match (an item not in the task is ignored). Returns how many items'
    matches were new or changed."""
    create_table(engine)
    changed = 0
    with engine.begin() as conn:
        ids = dict(conn.execute(select(items.c.key, items.c.id).where(items.c.task_id == task.id)).all())
        known = {
            r.item_id: r
            for r in conn.execute(select(item_originals).join(items).where(items.c.task_id == task.id)).all()
        }
        for match in matches:
            item_id = ids.get(match.key)
            if item_id is None:
                continue
            row = {
                "original_key": match.original_key,
                "original_title": match.original_title,
                "original_thumbnail": match.original_thumbnail,
                "similarity": match.similarity,
            }
            before = known.get(item_id)
            if before is None:
                conn.execute(item_originals.insert().values(item_id=item_id, **row))
            elif any(getattr(before, k) != v for k, v in row.items()):
                conn.execute(item_originals.update().where(item_originals.c.item_id == item_id).values(**row))
            else:
                continue
            changed += 1
    return changed


class Lookup:
    """The original of a served item, asked only of tasks that have any: most tasks have none, and the
    extra transaction each round trip would queue behind the annotators' answers on SQLite's one
    connection. Whether a task has originals is read again after `recheck_s` (the queue asset, another
    process, records them)."""

    def __init__(self, engine: Engine, recheck_s: float = 30.0):
        self.engine, self.recheck_s = engine, recheck_s
        self._checked: dict[int, tuple[float, bool]] = {}

    def __call__(self, task: Task, item_id: int) -> Original | None:
        moment = time.monotonic()
        checked_at, has_any = self._checked.get(task.id, (-float("inf"), False))
        if not has_any and moment - checked_at > self.recheck_s:
            has_any = _task_has_originals(self.engine, task)
            self._checked[task.id] = (moment, has_any)
        return of_item(self.engine, item_id) if has_any else None


def _task_has_originals(engine: Engine, task: Task) -> bool:
    with engine.begin() as conn:
        return bool(
            conn.execute(
                select(exists(select(item_originals.c.item_id).join(items).where(items.c.task_id == task.id)))
            ).scalar()
        )


def of_item(engine: Engine, item_id: int) -> Original | None:
    with engine.begin() as conn:
        row = conn.execute(select(item_originals).where(item_originals.c.item_id == item_id)).first()
    if row is None:
        return None
    thumbnail = f"/media/{row.original_thumbnail}" if row.original_thumbnail else None
    return Original(key=row.original_key, title=row.original_title, thumbnail_url=thumbnail, similarity=row.similarity)
