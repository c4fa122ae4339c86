"""Tasks, their items and the assignment of items to annotators (serve, answer, skip, undo).

Every operation is a short transaction; claiming a slot is one conditional UPDATE (see db.py), so
concurrent annotators never push an item past k answers and no answer is overwritten."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, delete, exists, insert, or_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from ground_truth.annotator_model import AnnotatorModel
from ground_truth.db import accounts, item_sources, items, models, skips, slots, tasks, verdicts
from ground_truth.schema import ItemIn, Shown, TaskSpec

LEASE = timedelta(minutes=10)  # an unanswered claim is given to someone else after this
CLAIM_ATTEMPTS = 8
# which serve is a gold question, and which one: unpredictable, so no position in the queue gives it away
GOLD_DRAW = random.SystemRandom()


@dataclass(frozen=True)
class Task:
    id: int
    spec: TaskSpec


class NotFound(LookupError):
    pass


class Conflict(ValueError):
    pass


class Busy(RuntimeError):
    """Every attempt to claim a slot lost a race: the client should retry (never read as 'nothing left')."""


def now() -> datetime:
    return datetime.now(UTC)


def create_task(engine: Engine, spec: TaskSpec) -> Task:
    """Create the task, or return it when one with the same spec exists (idempotent)."""
    with engine.begin() as conn:
        row = conn.execute(select(tasks).where(tasks.c.name == spec.name)).first()
        if row is not None:
            if TaskSpec.model_validate(row.spec) != spec:
                raise Conflict(f"task {spec.name!r} exists with another spec")
            return Task(row.id, spec)
        task_id = conn.execute(
            insert(tasks).values(name=spec.name, spec=spec.model_dump(mode="json"), created_at=now())
        ).inserted_primary_key[0]
    return Task(task_id, spec)


def get_task(engine: Engine, name: str) -> Task:
    with engine.begin() as conn:
        row = conn.execute(select(tasks).where(tasks.c.name == name)).first()
    if row is None:
        raise NotFound(f"no task {name!r}")
    return Task(row.id, TaskSpec.model_validate(row.spec))


def list_tasks(engine: Engine) -> list[Task]:
    with engine.begin() as conn:
        rows = conn.execute(select(tasks).order_by(tasks.c.id)).all()
    return [Task(r.id, TaskSpec.model_validate(r.spec)) for r in rows]


def add_items(engine: Engine, task: Task, new: list[ItemIn]) -> int:
    """Add items (with k answer slots each, or one when the task is adaptive; none for gold questions); an
    item already in the task only gains the new source queue. Returns how many items were new. Idempotent.
    Seeded gold questions (an expert's known answers) are items with `gold_label` set."""
    if task.spec.labels is not None:
        bad = [i.key for i in new if i.gold_label is not None and i.gold_label not in task.spec.labels]
        if bad:
            raise ValueError(f"gold labels outside the label set for {bad[:5]}")
    with engine.begin() as conn:
        existing = _existing_ids(conn, task, [i.key for i in new])
        fresh: dict[str, ItemIn] = {}  # each new key's first occurrence, in order
        for item in new:
            if item.key not in existing:
                fresh.setdefault(item.key, item)
        if fresh:  # a few statements for the whole batch, not a few per item
            moment = now()
            conn.execute(
                insert(items),
                [{"task_id": task.id, "created_at": moment, **i.model_dump(exclude={"queue"})} for i in fresh.values()],
            )
            existing.update(_existing_ids(conn, task, list(fresh)))
            answer_slots = [
                {"item_id": existing[key], "slot": s}
                for key, item in fresh.items()
                if item.gold_label is None
                for s in range(task.spec.first_answers)
            ]
            if answer_slots:
                conn.execute(insert(slots), answer_slots)
        _add_sources(conn, [(existing[i.key], i.queue) for i in new])
    return len(fresh)


def _add_sources(conn: Connection, wanted: list[tuple[int, str]]) -> None:
    """Record each (item, source queue) pair not yet recorded."""
    ids = sorted({item_id for item_id, _ in wanted})
    known: set[tuple[int, str]] = set()
    for start in range(0, len(ids), 500):
        rows = conn.execute(
            select(item_sources.c.item_id, item_sources.c.queue).where(
                item_sources.c.item_id.in_(ids[start : start + 500])
            )
        )
        known.update((r.item_id, r.queue) for r in rows)
    missing = list(dict.fromkeys(pair for pair in wanted if pair not in known))
    if missing:
        moment = now()
        conn.execute(insert(item_sources), [{"item_id": i, "queue": q, "added_at": moment} for i, q in missing])


def set_gold(engine: Engine, task: Task, known: dict[str, str], rng: random.Random) -> int:
    """Give items with a known answer (an earlier release's verdicts and confident labels)
    their gold label, chosen at random, until gold_share of the task's items carry one. Each is then served
    as a gold question to the annotators who have not answered it. Returns how many were set; idempotent
    once the share is reached."""
    if not task.spec.gold_share or not known:
        return 0
    with engine.begin() as conn:
        rows = conn.execute(select(items.c.id, items.c.key, items.c.gold_label).where(items.c.task_id == task.id)).all()
        wanted = round(task.spec.gold_share * len(rows)) - sum(r.gold_label is not None for r in rows)
        candidates = sorted((r.id, r.key) for r in rows if r.gold_label is None and r.key in known)
        chosen = rng.sample(candidates, max(0, min(wanted, len(candidates))))
        for item_id, key in chosen:
            conn.execute(update(items).where(items.c.id == item_id).values(gold_label=known[key]))
    return len(chosen)


def _existing_ids(conn: Connection, task: Task, keys: list[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for start in range(0, len(keys), 500):
        rows = conn.execute(
            select(items.c.key, items.c.id).where(
                items.c.task_id == task.id, items.c.key.in_(keys[start : start + 500])
            )
        )
        found.update({r.key: r.id for r in rows})
    return found


def shows_media(engine: Engine, path: str) -> bool:
    """Whether some item of some task shows this file (its thumbnail): the media route serves nothing else."""
    with engine.begin() as conn:
        return conn.execute(select(exists().where(items.c.thumbnail == path))).scalar()


def serve(engine: Engine, task: Task, account_id: int, rng: random.Random = GOLD_DRAW) -> Shown | None:
    """The item this annotator should label now: the one they hold, else with probability gold_share a
    gold question they have not seen (drawn at random), else a freshly claimed slot of the
    highest-priority open item. None when nothing is left. `rng`: a seeded one makes a simulation repeatable."""
    with engine.begin() as conn:
        return _claim(conn, task, account_id, rng)


def _claim(conn: Connection, task: Task, account_id: int, rng: random.Random) -> Shown | None:
    """serve() inside the caller's transaction: each attempt in a savepoint, so a lost race (PostgreSQL;
    SQLite's writer holds the database) is rolled back alone and tried again."""
    for _ in range(CLAIM_ATTEMPTS):
        try:
            with conn.begin_nested():
                found, settled = _serve_once(conn, task, account_id, rng)
                if settled:
                    return _shown(conn, task, found) if found is not None else None
        except IntegrityError:  # another request of this annotator claimed a slot of the item meanwhile
            continue
    raise Busy(f"{CLAIM_ATTEMPTS} claims in a row lost a race to other annotators: retry")


def _serve_once(conn: Connection, task: Task, account_id: int, rng: random.Random) -> tuple[int | None, bool]:
    """(item id, settled); not settled when the candidate slot was claimed by someone else first."""
    moment = now()
    held = _held(conn, task, account_id)
    if held is not None:
        conn.execute(update(slots).where(slots.c.id == held.slot_id).values(leased_until=moment + LEASE))
        return held.item_id, True
    gold = _gold_question(conn, task, account_id, rng)
    if gold is not None:
        conn.execute(insert(slots).values(item_id=gold, slot=None, holder=account_id, leased_until=moment + LEASE))
        return gold, True
    free = or_(slots.c.holder.is_(None), slots.c.leased_until < moment)
    candidate = conn.execute(
        select(slots.c.id, slots.c.item_id)
        .join(items)
        .where(
            items.c.task_id == task.id,
            slots.c.slot.is_not(None),
            slots.c.answered_at.is_(None),
            free,
            _not_seen_by(account_id),
        )
        .order_by(items.c.priority.desc(), items.c.id, slots.c.slot)
        .limit(1)
    ).first()
    if candidate is None:
        return None, True
    # the conditional UPDATE is the claim: a concurrent claimer of the same slot updates nothing
    claimed = conn.execute(
        update(slots)
        .where(slots.c.id == candidate.id, slots.c.answered_at.is_(None), free)
        .values(holder=account_id, leased_until=moment + LEASE)
    ).rowcount
    return candidate.item_id, claimed == 1


def _gold_question(conn: Connection, task: Task, account_id: int, rng: random.Random) -> int | None:
    """With probability gold_share, a gold question this annotator has not seen, drawn at random."""
    if not task.spec.gold_share or rng.random() >= task.spec.gold_share:
        return None
    unseen = (
        conn.execute(
            select(items.c.id)
            .where(items.c.task_id == task.id, items.c.gold_label.is_not(None), _not_seen_by(account_id))
            .order_by(items.c.id)
        )
        .scalars()
        .all()
    )
    return rng.choice(unseen) if unseen else None


@dataclass(frozen=True)
class _Held:
    slot_id: int
    item_id: int


def _held(conn: Connection, task: Task, account_id: int) -> _Held | None:
    row = conn.execute(
        select(slots.c.id, slots.c.item_id)
        .join(items)
        .where(
            items.c.task_id == task.id,
            slots.c.holder == account_id,
            slots.c.answered_at.is_(None),
            slots.c.leased_until >= now(),
        )
        .order_by(slots.c.id)
        .limit(1)
    ).first()
    return _Held(row.id, row.item_id) if row else None


def _not_seen_by(account_id: int):
    mine = select(slots.c.item_id).where(slots.c.holder == account_id)
    skipped = select(skips.c.item_id).where(skips.c.account_id == account_id)
    return and_(items.c.id.not_in(mine), items.c.id.not_in(skipped))


def answer(engine: Engine, task: Task, account_id: int, item_id: int, label: str) -> None:
    """Record the answer to the item this annotator holds."""
    with engine.begin() as conn:
        _answer(conn, task, account_id, item_id, label)


def answer_and_serve(
    engine: Engine, task: Task, account_id: int, item_id: int, label: str, rng: random.Random = GOLD_DRAW
) -> tuple[Shown | None, bool]:
    """Record the answer and claim the next item in one transaction (one commit per round trip instead of
    two): (next item, retry). retry: the answer is saved but every claim lost a race; ask again."""
    with engine.begin() as conn:
        _answer(conn, task, account_id, item_id, label)
        try:
            return _claim(conn, task, account_id, rng), False
        except Busy:
            return None, True  # leaving the block commits the answer


def _answer(conn: Connection, task: Task, account_id: int, item_id: int, label: str) -> None:
    if task.spec.labels is not None and label not in task.spec.labels:
        raise ValueError(f"label must be one of {task.spec.labels}, not {label!r}")
    if task.spec.labels is None and not 1 <= len(label.strip()) <= 2000:
        raise ValueError("a free-text answer must be 1-2000 characters")
    done = conn.execute(
        update(slots)
        .where(
            slots.c.item_id == item_id,
            slots.c.holder == account_id,
            slots.c.answered_at.is_(None),
            slots.c.item_id.in_(select(items.c.id).where(items.c.task_id == task.id)),
        )
        .values(label=label, answered_at=now(), leased_until=None)
    ).rowcount
    if done == 1:
        if task.spec.adaptive:
            _ask_again_if_uncertain(conn, task, item_id)
        return
    mine = conn.execute(
        select(slots.c.answered_at).where(slots.c.item_id == item_id, slots.c.holder == account_id)
    ).first()
    if mine is not None:
        raise Conflict(f"item {item_id} is already answered: undo it first to change the answer")
    raise Conflict(
        f"item {item_id} is not assigned to you (never served, skipped, or the lease ran out "
        "and someone else took it): ask for the next item"
    )


def skip(engine: Engine, task: Task, account_id: int, item_id: int) -> None:
    with engine.begin() as conn:
        held = conn.execute(
            select(slots.c.id, slots.c.slot)
            .join(items)
            .where(
                items.c.task_id == task.id,
                slots.c.item_id == item_id,
                slots.c.holder == account_id,
                slots.c.answered_at.is_(None),
            )
        ).first()
        if held is None:
            raise Conflict(f"item {item_id} is not assigned to you unanswered, so it cannot be skipped")
        if held.slot is None:
            conn.execute(delete(slots).where(slots.c.id == held.id))
        else:
            conn.execute(update(slots).where(slots.c.id == held.id).values(holder=None, leased_until=None))
        conn.execute(insert(skips).values(item_id=item_id, account_id=account_id))


def undo(engine: Engine, task: Task, account_id: int) -> Shown:
    """Take back this annotator's newest answer (unless a reviewer already ruled on the item) and serve
    that item again; any item they held unanswered goes back to the pool."""
    with engine.begin() as conn:
        last = conn.execute(
            select(slots.c.id, slots.c.item_id)
            .join(items)
            .where(items.c.task_id == task.id, slots.c.holder == account_id, slots.c.answered_at.is_not(None))
            .order_by(slots.c.answered_at.desc(), slots.c.id.desc())
            .limit(1)
        ).first()
        if last is None:
            raise Conflict("nothing to undo")
        if conn.execute(select(exists().where(verdicts.c.item_id == last.item_id))).scalar():
            raise Conflict(f"item {last.item_id} is already adjudicated; the answer stays")
        held = conn.execute(
            select(slots.c.id, slots.c.slot)
            .join(items)
            .where(items.c.task_id == task.id, slots.c.holder == account_id, slots.c.answered_at.is_(None))
        ).all()
        for row in held:
            if row.slot is None:
                conn.execute(delete(slots).where(slots.c.id == row.id))
            else:
                conn.execute(update(slots).where(slots.c.id == row.id).values(holder=None, leased_until=None))
        conn.execute(
            update(slots).where(slots.c.id == last.id).values(label=None, answered_at=None, leased_until=now() + LEASE)
        )
        return _shown(conn, task, last.item_id)


def _shown(conn: Connection, task: Task, item_id: int) -> Shown:
    row = conn.execute(select(items).where(items.c.id == item_id)).one()
    return Shown(
        item_id=row.id,
        key=row.key,
        title=row.title,
        description=row.description,
        thumbnail_url=f"/media/{row.thumbnail}" if row.thumbnail else None,
        model_score=row.model_score if task.spec.show_model_score else None,
        labels=task.spec.labels,
        question=task.spec.question,
        instructions=task.spec.instructions,
    )


# Adaptive answers: an item of an adaptive task starts with one slot. When its last slot is answered, its
# label posterior under the task's newest annotator model decides: confident, or max_answers reached,
# and it is done; else it gets one more slot. Fixed-k tasks never change their slots.


def load_model(conn: Connection, task: Task) -> AnnotatorModel:
    """The task's newest fitted annotator model; before the first fit, the prior alone."""
    row = conn.execute(select(models.c.model).where(models.c.task_id == task.id)).first()
    return AnnotatorModel.from_json(row.model) if row else AnnotatorModel.unfitted(task.spec.labels or [])


def store_model(engine: Engine, task: Task, model: AnnotatorModel, answers: int) -> None:
    with engine.begin() as conn:
        conn.execute(delete(models).where(models.c.task_id == task.id))
        conn.execute(insert(models).values(task_id=task.id, model=model.to_json(), answers=answers, fitted_at=now()))


def confident(task: Task, model: AnnotatorModel, answers: list[tuple[str, str]]) -> bool:
    return bool(answers) and max(model.posterior(answers)) >= task.spec.confidence


def _regular_slots(conn: Connection, where) -> list:
    return conn.execute(
        select(
            slots.c.id,
            slots.c.item_id,
            slots.c.slot,
            slots.c.holder,
            slots.c.leased_until,
            slots.c.label,
            accounts.c.username,
        )
        .outerjoin(accounts, accounts.c.id == slots.c.holder)
        .where(slots.c.slot.is_not(None), where)
        .order_by(slots.c.item_id, slots.c.slot)
    ).all()


def _ask_again_if_uncertain(conn: Connection, task: Task, item_id: int) -> None:
    rows = _regular_slots(conn, slots.c.item_id == item_id)
    if not rows or any(r.label is None for r in rows) or len(rows) >= task.spec.max_answers:
        return
    if confident(task, load_model(conn, task), [(r.username, r.label) for r in rows]):
        return
    try:
        with conn.begin_nested():
            conn.execute(insert(slots).values(item_id=item_id, slot=max(r.slot for r in rows) + 1))
    except IntegrityError:  # the item's other last answer, committed at the same moment, added it
        pass


def rebalance(engine: Engine, task: Task) -> dict[str, int]:
    """After a new model fit (adaptive tasks): give an answered item that is now uncertain one more slot,
    and take back the unclaimed slots of an item that is now confident. Also catches an item whose last two
    answers came in together, each seeing the other's slot open. Returns the counts."""
    if not task.spec.adaptive:
        return {"slots_added": 0, "slots_removed": 0}
    added = removed = 0
    moment = now()
    with engine.begin() as conn:
        model = load_model(conn, task)
        rows = _regular_slots(conn, slots.c.item_id.in_(select(items.c.id).where(items.c.task_id == task.id)))
        ruled = set(conn.execute(select(verdicts.c.item_id).join(items).where(items.c.task_id == task.id)).scalars())
        by_item: dict[int, list] = {}
        for r in rows:
            by_item.setdefault(r.item_id, []).append(r)
        for item_id, found in by_item.items():
            answered = [(r.username, r.label) for r in found if r.label is not None]
            free = [r.id for r in found if r.label is None and (r.holder is None or _expired(r.leased_until, moment))]
            sure = item_id in ruled or confident(task, model, answered)
            if sure and free and answered:
                conn.execute(delete(slots).where(slots.c.id.in_(free)))
                removed += len(free)
            elif not sure and len(answered) == len(found) < task.spec.max_answers:
                conn.execute(insert(slots).values(item_id=item_id, slot=max(r.slot for r in found) + 1))
                added += 1
    return {"slots_added": added, "slots_removed": removed}


def _expired(leased_until: datetime | None, moment: datetime) -> bool:
    if leased_until is None:
        return True
    if leased_until.tzinfo is None:  # SQLite returns naive datetimes
        leased_until = leased_until.replace(tzinfo=UTC)
    return leased_until < moment
