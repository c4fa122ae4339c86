"""What the answers add up to: the annotator model (Dawid-Skene) and each item's label posterior,
disputes for reviewers, verdicts, resolved labels, agreement per task (Krippendorff's alpha with a
bootstrap interval) and per annotator, each annotator's accuracy on gold questions with its interval,
and the annotators flagged for a gold accuracy below the task's floor (their answers down-weighted)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field

from sqlalchemy import exists, func, insert, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from ground_truth import annotator_model as am
from ground_truth import queue
from ground_truth.agreement import (
    cohen_kappa,
    fleiss_kappa,
    krippendorff_alpha,
    krippendorff_alpha_interval,
    wilson_interval,
)
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
    slots: int | None = None  # regular answer slots (None: k, as in a fixed-k task)

    def complete(self, k: int) -> bool:
        """Every slot answered: k of them, or as many as the adaptive queue gave the item."""
        return len(self.answers) >= (k if self.slots is None else max(self.slots, 1))

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

    def resolution(self, k: int, posterior: list[float] | None, labels: list[str] | None, confidence: float):
        """(label, how): the verdict; else, once every slot is answered, the annotator model's most likely
        label when its posterior reaches `confidence` ("unanimous" when the answers agree, else "model"),
        else the unanimous answer; (None, None) while open or disputed."""
        if self.verdict is not None:
            return self.verdict, "verdict"
        if not self.complete(k):
            return None, None
        if posterior is not None and labels is not None and max(posterior) >= confidence:
            best = labels[posterior.index(max(posterior))]
            unanimous = not self.disputed and next(iter(self.answers.values())) == best
            return best, "unanimous" if unanimous else "model"
        if not self.disputed:
            return next(iter(self.answers.values())), "unanimous"
        return None, None


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
        slotted: dict[int, int] = dict(
            conn.execute(
                select(slots.c.item_id, func.count())
                .join(items)
                .where(items.c.task_id == task.id, slots.c.slot.is_not(None))
                .group_by(slots.c.item_id)
            ).all()
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
            slots=slotted.get(r.id, 0),
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
    """Items whose every slot is answered without agreeing, that the annotator model cannot settle at the
    task's confidence, not yet adjudicated (labelled tasks only)."""
    if task.spec.labels is None:
        return []
    states = item_states(engine, task)
    model = fit_model(task, states, annotator_weights(task, _gold_scores(states)))
    return [s for s in states if _open_dispute(task, s, model)]


def _open_dispute(task: Task, state: ItemState, model: am.AnnotatorModel | None) -> bool:
    if state.is_gold_question or not state.complete(task.spec.annotators_per_item):
        return False
    posterior = model.posteriors.get(state.key) if model else None
    label, _ = state.resolution(task.spec.annotators_per_item, posterior, task.spec.labels, task.spec.confidence)
    return label is None


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
    # the whole interval below the task's min_gold_accuracy: their answers count flagged_weight in the model
    flagged: bool = False
    weight: float = 1.0
    model_accuracy: float | None = None  # the annotator model's estimate (its confusion matrix, class prior)


@dataclass(frozen=True)
class TaskQuality:
    items: int
    complete: int
    resolved: int
    disputed_open: int
    krippendorff_alpha: float | None
    fleiss_kappa: float | None
    annotators: list[AnnotatorQuality]
    krippendorff_alpha_low: float | None = None  # 95% bootstrap interval over items
    krippendorff_alpha_high: float | None = None
    method: str | None = None  # the annotator model behind the posteriors ("dawid-skene")
    answers: int = 0  # regular answers (gold questions not counted)


def _resolved_without(state: ItemState, person: str, k: int) -> str | None:
    """The item's resolution left without this person's answer: the verdict, else the other annotators'
    answer when all k answered and the others agree; None while open (or with no one else)."""
    if state.verdict is not None:
        return state.verdict
    others = {label for who, label in state.answers.items() if who != person}
    return next(iter(others)) if state.complete(k) and len(others) == 1 else None


def _gold_scores(states: list[ItemState]) -> dict[str, list[bool]]:
    """annotator -> whether each gold question they answered matched its known answer."""
    gold: dict[str, list[bool]] = defaultdict(list)
    for s in states:
        for person, label in s.gold_answers.items():
            gold[person].append(label == s.gold_label)
    return gold


def is_flagged(task: Task, scores: list[bool]) -> bool:
    """The 95% interval of their gold accuracy lies wholly below the task's floor: a bad draw of a few
    gold questions does not flag anyone, a clearly weak annotator is flagged."""
    interval = wilson_interval(sum(scores), len(scores))
    return interval is not None and interval[1] < task.spec.min_gold_accuracy


def annotator_weights(task: Task, gold: dict[str, list[bool]]) -> dict[str, float]:
    return {person: task.spec.flagged_weight for person, scores in gold.items() if is_flagged(task, scores)}


def fit_model(task: Task, states: list[ItemState], weights: dict[str, float]) -> am.AnnotatorModel | None:
    """Dawid-Skene over the regular answers and the gold questions' answers; gold keys and verdicts are
    known labels. None for a free-text task."""
    labels = task.spec.labels
    if labels is None:
        return None
    answers = [am.Answer(s.key, who, label) for s in states for who, label in s.answers.items()]
    answers += [am.Answer(s.key, who, label) for s in states for who, label in s.gold_answers.items()]
    known: dict[Hashable, str] = {
        s.key: given for s in states if (given := s.verdict or s.gold_label) is not None and given in labels
    }
    return am.fit([a for a in answers if a.label in labels], labels, known, weights)


def _annotator_quality(
    task: Task, person: str, answered: list[tuple[str, str | None]], gold: list[bool], model: am.AnnotatorModel | None
) -> AnnotatorQuality:
    pairs = [(a, r) for a, r in answered if r is not None]
    interval = wilson_interval(sum(gold), len(gold)) or (None, None)
    flagged = is_flagged(task, gold)
    return AnnotatorQuality(
        annotator=person,
        answers=len(answered),
        agreement_with_resolved=sum(a == r for a, r in pairs) / len(pairs) if pairs else None,
        kappa_vs_resolved=cohen_kappa([a for a, _ in pairs], [r for _, r in pairs]) if pairs else None,
        gold_answered=len(gold),
        gold_accuracy=sum(gold) / len(gold) if gold else None,
        gold_accuracy_low=interval[0],
        gold_accuracy_high=interval[1],
        flagged=flagged,
        weight=task.spec.flagged_weight if flagged else 1.0,
        model_accuracy=model.accuracy(person) if model and person in model.confusion else None,
    )


def task_quality(
    engine: Engine, task: Task, states: list[ItemState] | None = None, model: am.AnnotatorModel | None = None
) -> TaskQuality:
    k = task.spec.annotators_per_item
    states = item_states(engine, task) if states is None else states
    gold = _gold_scores(states)
    model = model or fit_model(task, states, annotator_weights(task, gold))
    labelled = [s for s in states if not s.is_gold_question]
    complete = [s for s in labelled if s.complete(k)]
    per_person: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for s in states:
        for person, label in s.answers.items():
            per_person[person].append((label, _resolved_without(s, person, k)))
    people = [
        _annotator_quality(task, person, per_person[person], gold[person], model)
        for person in sorted({*per_person, *gold})
    ]
    nominal = task.spec.labels is not None
    units = [list(s.answers.values()) for s in labelled]
    interval = krippendorff_alpha_interval(units) if nominal else None
    resolved = [s.resolution(k, _posterior(model, s), task.spec.labels, task.spec.confidence)[0] for s in labelled]
    return TaskQuality(
        items=len(labelled),
        complete=len(complete),
        resolved=sum(label is not None for label in resolved),
        disputed_open=sum(_open_dispute(task, s, model) for s in labelled) if nominal else 0,
        krippendorff_alpha=krippendorff_alpha(units) if nominal else None,
        fleiss_kappa=_fleiss(task, complete) if nominal else None,
        annotators=people,
        krippendorff_alpha_low=interval[0] if interval else None,
        krippendorff_alpha_high=interval[1] if interval else None,
        method=model.method if model else None,
        answers=sum(len(u) for u in units),
    )


def _posterior(model: am.AnnotatorModel | None, state: ItemState) -> list[float] | None:
    return model.posteriors.get(state.key) if model else None


def _fleiss(task: Task, complete: list[ItemState]) -> float | None:
    """Fleiss' kappa needs the same number of answers per item: fixed-k tasks only."""
    k = task.spec.annotators_per_item
    if task.spec.adaptive or not complete or k < 2:
        return None
    return fleiss_kappa([list(s.answers.values())[:k] for s in complete])


def refresh_model(engine: Engine, task: Task) -> tuple[am.AnnotatorModel | None, dict[str, int]]:
    """Fit the annotator model on every answer so far, store it for the queue and, on an adaptive task,
    rebalance the items' slots to it: what the queue and release assets run, and `mlplane labeling refit`."""
    states = item_states(engine, task)
    model = fit_model(task, states, annotator_weights(task, _gold_scores(states)))
    if model is None:
        return None, {"slots_added": 0, "slots_removed": 0}
    answers = sum(len(s.answers) + len(s.gold_answers) for s in states)
    queue.store_model(engine, task, model, answers)
    return model, queue.rebalance(engine, task)
