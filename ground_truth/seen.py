"""Read-only questions the app asks about one person: which media files they may see, how far they are
in a task, and their score on gold questions; and a reviewer's undo of their own verdict."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlalchemy import and_, delete, exists, func, or_, select
from sqlalchemy.engine import Engine

from ground_truth.accounts import Account
from ground_truth.db import items, skips, slots, verdicts
from ground_truth.originals import item_originals
from ground_truth.queue import Conflict, Task, now
from ground_truth.schema import Role

GOLD_SCORE_STEP = 10  # the gold score moves only every this many answers: it never tells which item was gold


def may_see_media(engine: Engine, account: Account, path: str) -> bool:
    """Whether the file is the thumbnail of an item (or of its matched original) that this person may
    see: an annotator only items they were given, a reviewer or admin any queued item."""
    shows = or_(items.c.thumbnail == path, item_originals.c.original_thumbnail == path)
    query = select(items.c.id).select_from(items.outerjoin(item_originals)).where(shows)
    if account.role == Role.annotator:
        query = query.join(slots, slots.c.item_id == items.c.id).where(slots.c.holder == account.id)
    with engine.begin() as conn:
        return conn.execute(select(exists(query))).scalar()


@dataclass(frozen=True)
class Progress:
    done: int  # answers given in this task
    remaining: int  # items this person could still be given (others may take some first)
    gold_scored: int  # gold questions counted in the score (those among the first `scored_through` answers)
    gold_correct: int
    scored_through: int

    @property
    def gold_accuracy(self) -> float | None:
        return self.gold_correct / self.gold_scored if self.gold_scored else None


def progress(engine: Engine, task: Task, account_id: int) -> Progress:
    moment = now()
    with engine.begin() as conn:
        answered = conn.execute(
            select(slots.c.slot, slots.c.label, items.c.gold_label)
            .join(items)
            .where(items.c.task_id == task.id, slots.c.holder == account_id, slots.c.answered_at.is_not(None))
            .order_by(slots.c.answered_at, slots.c.id)
        ).all()
        mine = select(slots.c.item_id).where(slots.c.holder == account_id)
        skipped = select(skips.c.item_id).where(skips.c.account_id == account_id)
        open_slot = and_(
            slots.c.slot.is_not(None),
            slots.c.answered_at.is_(None),
            or_(slots.c.holder.is_(None), slots.c.leased_until < moment),
        )
        remaining = conn.execute(
            select(func.count(func.distinct(items.c.id)))
            .select_from(items.join(slots))
            .where(items.c.task_id == task.id, open_slot, items.c.id.not_in(mine), items.c.id.not_in(skipped))
        ).scalar()
        holding = conn.execute(
            select(func.count())
            .select_from(slots.join(items))
            .where(
                items.c.task_id == task.id,
                slots.c.holder == account_id,
                slots.c.slot.is_not(None),  # a gold question is not one of the task's items to do
                slots.c.answered_at.is_(None),
                slots.c.leased_until >= moment,
            )
        ).scalar()
    through = len(answered) // GOLD_SCORE_STEP * GOLD_SCORE_STEP
    gold = [row for row in answered[:through] if row.slot is None]
    return Progress(
        done=len(answered),
        remaining=remaining + holding,
        gold_scored=len(gold),
        gold_correct=sum(row.label == row.gold_label for row in gold),
        scored_through=through,
    )


def undo_verdict(engine: Engine, task: Task, reviewer: Account, item_id: int) -> None:
    """Take back a verdict: the item's dispute is open again. Only the reviewer who gave it (or an admin)."""
    with engine.begin() as conn:
        row = conn.execute(
            select(verdicts.c.reviewer_id).join(items).where(verdicts.c.item_id == item_id, items.c.task_id == task.id)
        ).first()
        if row is None:
            raise Conflict(f"item {item_id} of task {task.spec.name!r} has no verdict to undo")
        if row.reviewer_id != reviewer.id and reviewer.role != Role.admin:
            raise Conflict(f"the verdict on item {item_id} is another reviewer's")
        conn.execute(delete(verdicts).where(verdicts.c.item_id == item_id))


def majority(answers: dict[str, str]) -> str | None:
    """The answer most annotators gave; None on a tie for the most."""
    counts = Counter(answers.values()).most_common()
    if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
        return None
    return counts[0][0]
