"""Upgrades of the rows of a label store made by an older version of this package. db.connect runs them
after create_all, which adds new tables and indexes but never changes a row.

The store's version is the one row of gt_schema_version; a store without it was made before versions were
recorded (version 1). Each step runs once, in order, all in one transaction with the new version, so a
failed upgrade leaves the store as it was. Two processes connecting at once do not both upgrade: SQLite's
BEGIN IMMEDIATE (db.connect) and, on PostgreSQL, a transaction-scoped advisory lock make the second wait
and then find the version already raised."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.engine import Connection, Engine

from ground_truth.db import items, schema_version, slots, tasks
from ground_truth.schema import TaskSpec

UNVERSIONED = 1
ADVISORY_LOCK = 0x67745F6D6967  # any constant of this package's own: "gt_mig"


def upgrade(engine: Engine) -> list[int]:
    """Bring the store to the newest version; returns the versions applied (none when already there)."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK})
        current = conn.execute(select(func.max(schema_version.c.version))).scalar()
        if current is None:
            conn.execute(insert(schema_version).values(version=UNVERSIONED))
            current = UNVERSIONED
        applied = []
        for version, step in sorted(STEPS.items()):
            if version > current:
                step(conn)
                applied.append(version)
        if applied:
            conn.execute(update(schema_version).values(version=applied[-1]))
    return applied


# Version 2: the built-in tasks ask adaptively ("until 90% sure or 5 answers") instead of three answers
# per item. Their stored spec is rewritten and each item keeps at most one open answer slot, which is how
# an adaptive task asks (queue.py); no answer, held slot or verdict is touched. Which items need no more
# answers is up to the annotator model: the next refit's rebalance takes back the open slot of a confident
# item and gives one to a split item whose three answers are all in.
ADAPTIVE_BUILT_INS = ("content_violation", "recommendation_relevance")
FIXED_ANSWERS = 3


def _built_in_tasks_adaptive(conn: Connection) -> None:
    rows = conn.execute(select(tasks.c.id, tasks.c.spec).where(tasks.c.name.in_(ADAPTIVE_BUILT_INS))).all()
    for row in rows:
        spec = TaskSpec.model_validate(row.spec)
        if spec.adaptive or spec.annotators_per_item != FIXED_ANSWERS:
            continue  # already adaptive, or changed by hand: not the spec this step replaces
        adaptive = TaskSpec.model_validate({**spec.model_dump(), "adaptive": True, "max_answers": 5, "confidence": 0.9})
        conn.execute(update(tasks).where(tasks.c.id == row.id).values(spec=adaptive.model_dump(mode="json")))
        _keep_one_open_slot(conn, row.id)


def _keep_one_open_slot(conn: Connection, task_id: int) -> None:
    """Per item: an unanswered slot someone holds stays, and then no unheld one does; else the
    lowest-numbered unheld slot stays. Answered slots and gold questions' slots are never touched."""
    open_slots = conn.execute(
        select(slots.c.id, slots.c.item_id, slots.c.holder)
        .join(items, items.c.id == slots.c.item_id)
        .where(items.c.task_id == task_id, slots.c.slot.is_not(None), slots.c.answered_at.is_(None))
        .order_by(slots.c.item_id, slots.c.slot)
    ).all()
    by_item: dict[int, list] = {}
    for row in open_slots:
        by_item.setdefault(row.item_id, []).append(row)
    surplus = []
    for found in by_item.values():
        unheld = [r.id for r in found if r.holder is None]
        held = len(unheld) < len(found)
        surplus += unheld if held else unheld[1:]
    for start in range(0, len(surplus), 500):
        conn.execute(delete(slots).where(slots.c.id.in_(surplus[start : start + 500])))


STEPS: dict[int, Callable[[Connection], None]] = {2: _built_in_tasks_adaptive}
