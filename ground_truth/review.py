"""What the answers add up to: disputes for reviewers, verdicts, resolved labels, agreement per task and
per annotator, and each annotator's accuracy on gold questions with its interval."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import exists, insert, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from ground_truth.agreement import cohen_kappa, fleiss_kappa, krippendorff_alpha, wilson_interval
from ground_truth.db import accounts, item_sources, items, slots, verdicts
from ground_truth.queue import Conflict, NotFound, Task, now


@dataclass
class ItemState:
    item_id: int
    key: str
    title: str
    description: str
    thumbnail: str | None
    model_score: float | None
    gold_label: str | None
    is_gold_question: bool  # seeded with a known answer: scores annotators, not itself labelled
    answers: dict[str, str] = field(default_factory=dict)  # annotator -> label (regular slots)
    gold_answers: dict[str, str] = field(default_factory=dict)  # annotator -> label (as a gold question)
    verdict: str | None = None
    queues: list[str] = field(default_factory=list)

    def complete(self, k: int) -> bool:
        return len(self.answers) >= k

    @property
    def disputed(self) -> bool:
        return len(set(self.answers.values())) > 1

    def resolved_label(self, k: int) -> str | None:
        """The reviewer's verdict, else the unanimous answer of all k annotators; None while open."""
        if self.verdict is not None:
            return self.verdict
        if self.complete(k) and not self.disputed:
            return next(iter(self.answers.values()))
        return None


def item_states(engine: Engine, task: Task) -> list[ItemState]:
    with engine.begin() as conn:
        rows = conn.execute(select(items).where(items.c.task_id == task.id).order_by(items.c.id)).all()
        answers = conn.execute(
            select(slots.c.item_id, slots.c.slot, slots.c.label, accounts.c.username)
            .join(items, items.c.id == slots.c.item_id)
            .join(accounts, accounts.c.id == slots.c.holder)
            .where(items.c.task_id == task.id, slots.c.answered_at.is_not(None))
        ).all()
        ruled = conn.execute(
            select(verdicts.c.item_id, verdicts.c.label).join(items).where(items.c.task_id == task.id)
        ).all()
        sources = conn.execute(
            select(item_sources.c.item_id, item_sources.c.queue).join(items).where(items.c.task_id == task.id)
        ).all()
        # an item without regular slots was added as a gold question
        slotted = set(
            conn.execute(
                select(slots.c.item_id)
                .join(items)
                .where(items.c.task_id == task.id, slots.c.slot.is_not(None))
                .distinct()
            ).scalars()
        )
    states = {
        r.id: ItemState(
            r.id,
            r.key,
            r.title,
            r.description,
            r.thumbnail,
            r.model_score,
            r.gold_label,
            is_gold_question=r.id not in slotted,
        )
        for r in rows
    }
    for a in answers:
        (states[a.item_id].answers if a.slot is not None else states[a.item_id].gold_answers)[a.username] = a.label
    for v in ruled:
        states[v.item_id].verdict = v.label
    for s in sources:
        states[s.item_id].queues.append(s.queue)
    return list(states.values())


def disputes(engine: Engine, task: Task) -> list[ItemState]:
    """Items all k annotators answered without agreeing, not yet adjudicated (labelled tasks only)."""
    k = task.spec.annotators_per_item
    return [
        s
        for s in item_states(engine, task)
        if task.spec.labels is not None and s.complete(k) and s.disputed and s.verdict is None
    ]


VERDICT_MAX = 64  # a verdict is one of the labels, which are 1-64 characters (schema.TaskSpec)


def adjudicate(engine: Engine, task: Task, reviewer_id: int, item_id: int, label: str) -> None:
    """The reviewer's verdict settles an open dispute. Nothing else takes a verdict: a gold question's
    answer is the key that scores everyone. (A verdict is not made a gold label here: gold questions drawn
    only from disputes, the hardest items, would understate everyone's accuracy; see queue.set_gold.)"""
    if len(label) > VERDICT_MAX:
        raise ValueError(f"a verdict is at most {VERDICT_MAX} characters, not {len(label)}")
    if task.spec.labels is None:
        raise Conflict(f"task {task.spec.name!r} takes free text: it has no disputes to rule on")
    if label not in task.spec.labels:
        raise ValueError(f"verdict must be one of {task.spec.labels}, not {label!r}")
    try:
        with engine.begin() as conn:
            _check_open_dispute(conn, task, item_id)
            conn.execute(
                insert(verdicts).values(item_id=item_id, reviewer_id=reviewer_id, label=label, decided_at=now())
            )
    except IntegrityError as error:
        raise Conflict(f"item {item_id} already has a verdict") from error


def _check_open_dispute(conn: Connection, task: Task, item_id: int) -> None:
    """Raise unless all k annotators answered the item and disagree, with no verdict yet."""
    found = conn.execute(select(items.c.id).where(items.c.id == item_id, items.c.task_id == task.id)).first()
    if found is None:
        raise NotFound(f"no item {item_id} in task {task.spec.name!r}")
    if conn.execute(select(exists().where(verdicts.c.item_id == item_id))).scalar():
        raise Conflict(f"item {item_id} already has a verdict")
    regular = conn.execute(select(slots.c.label).where(slots.c.item_id == item_id, slots.c.slot.is_not(None))).all()
    if not regular:
        raise Conflict(f"item {item_id} is a gold question: its known answer is not up for review")
    answers = [r.label for r in regular if r.label is not None]
    if len(answers) < len(regular):
        raise Conflict(f"item {item_id} is not up for review: {len(answers)} of {len(regular)} answers are in")
    if len(set(answers)) < 2:
        raise Conflict(f"item {item_id} is not up for review: its answers agree")


@dataclass(frozen=True)
class AnnotatorQuality:
    annotator: str
    answers: int
    # share of their answers equal to the item's resolution without their own answer (the verdict, else
    # the other annotators' unanimous answer): counting their own answer in it flattered everyone
    agreement_with_resolved: float | None
    kappa_vs_resolved: float | None  # Cohen's kappa of the same pairs
    gold_answered: int
    gold_accuracy: float | None
    gold_accuracy_low: float | None  # its 95% Wilson interval
    gold_accuracy_high: float | None


@dataclass(frozen=True)
class TaskQuality:
    items: int
    complete: int
    resolved: int
    disputed_open: int
    krippendorff_alpha: float | None
    fleiss_kappa: float | None
    annotators: list[AnnotatorQuality]


def _resolved_without(state: ItemState, person: str, k: int) -> str | None:
    """The item's resolution left without this person's answer: the verdict, else the other annotators'
    answer when all k answered and the others agree; None while open (or with no one else)."""
    if state.verdict is not None:
        return state.verdict
    others = {label for who, label in state.answers.items() if who != person}
    return next(iter(others)) if state.complete(k) and len(others) == 1 else None


def _annotator_quality(person: str, answered: list[tuple[str, str | None]], gold: list[bool]) -> AnnotatorQuality:
    pairs = [(a, r) for a, r in answered if r is not None]
    interval = wilson_interval(sum(gold), len(gold)) or (None, None)
    return AnnotatorQuality(
        annotator=person,
        answers=len(answered),
        agreement_with_resolved=sum(a == r for a, r in pairs) / len(pairs) if pairs else None,
        kappa_vs_resolved=cohen_kappa([a for a, _ in pairs], [r for _, r in pairs]) if pairs else None,
        gold_answered=len(gold),
        gold_accuracy=sum(gold) / len(gold) if gold else None,
        gold_accuracy_low=interval[0],
        gold_accuracy_high=interval[1],
    )


def task_quality(engine: Engine, task: Task, states: list[ItemState] | None = None) -> TaskQuality:
    k = task.spec.annotators_per_item
    states = item_states(engine, task) if states is None else states
    labelled = [s for s in states if not s.is_gold_question]
    complete = [s for s in labelled if s.complete(k)]
    per_person: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    gold: dict[str, list[bool]] = defaultdict(list)
    for s in states:
        for person, label in s.answers.items():
            per_person[person].append((label, _resolved_without(s, person, k)))
        for person, label in s.gold_answers.items():
            gold[person].append(label == s.gold_label)
    people = [_annotator_quality(person, per_person[person], gold[person]) for person in sorted({*per_person, *gold})]
    nominal = task.spec.labels is not None
    return TaskQuality(
        items=len(labelled),
        complete=len(complete),
        resolved=sum(s.resolved_label(k) is not None for s in labelled),
        disputed_open=sum(s.disputed and s.verdict is None for s in complete),
        krippendorff_alpha=krippendorff_alpha([list(s.answers.values()) for s in labelled]) if nominal else None,
        fleiss_kappa=fleiss_kappa([list(s.answers.values())[:k] for s in complete])
        if nominal and complete and k >= 2
        else None,
        annotators=people,
    )
