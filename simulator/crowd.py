"""A labeling round by a crowd of simulated annotators of known, different accuracies, driven through the
label store's own functions (queue.serve and queue.answer, in process: the statistics need thousands of
answers, the HTTP path is tested elsewhere). The answer key and the accuracies stay here: the product sees
only the answers, and the gold questions an expert seeded (here the key's labels of items set aside)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sqlalchemy import insert
from sqlalchemy.engine import Engine

from ground_truth import queue, review
from ground_truth.db import accounts
from ground_truth.queue import now
from ground_truth.schema import ItemIn, Role, TaskSpec
from simulator.annotators import SimulatedAnnotator


@dataclass(frozen=True)
class CrowdRound:
    answers: int  # regular answers (gold questions not counted)
    gold_answers: int
    label_accuracy: float  # the annotator model's most likely label against the key, over every item
    covered: int  # annotators whose gold-accuracy interval holds their true accuracy
    scored: int  # annotators with at least one gold answer
    flagged: list[str]
    quality: review.TaskQuality


def crowd(count: int, low: float, high: float, prefix: str = "crowd") -> dict[str, float]:
    """`count` annotators with accuracies spread evenly over [low, high]."""
    return {f"{prefix}{i:02d}": low + (high - low) * i / max(count - 1, 1) for i in range(count)}


def add_annotators(engine: Engine, accuracy: dict[str, float]) -> dict[str, int]:
    """Accounts for the crowd (with an unusable password hash: they never sign in) -> their ids."""
    made = {}
    with engine.begin() as conn:
        for name in accuracy:
            made[name] = conn.execute(
                insert(accounts).values(username=name, password_hash="!", role=Role.annotator.value, created_at=now())
            ).inserted_primary_key[0]
    return made


def run_round(
    engine: Engine,
    spec: TaskSpec,
    truth: dict[str, str],
    gold: dict[str, str],
    ids: dict[str, int],
    accuracy: dict[str, float],
    seed: int,
    refit_every: int = 200,
) -> CrowdRound:
    """Items `truth` (key -> true label) and seeded gold questions `gold` go into a new task; the crowd
    answers in a shuffled round robin until the queue has nothing left for anyone; the annotator model is
    refitted every `refit_every` answers (the queue asset's refit, run more often)."""
    task = queue.create_task(engine, spec)
    queue.add_items(engine, task, [ItemIn(key=k, queue="audit") for k in truth])
    queue.add_items(engine, task, [ItemIn(key=k, queue="seeded_gold", gold_label=v) for k, v in gold.items()])
    rng = random.Random(seed)
    people = [SimulatedAnnotator(name, "", accuracy[name], seed=seed) for name in sorted(accuracy)]
    draws = {p.username: random.Random(f"{seed}:{p.username}") for p in people}
    key = {**truth, **gold}
    active, answered = list(people), 0
    while active:
        rng.shuffle(active)
        for person in list(active):
            item = queue.serve(engine, task, ids[person.username], rng)
            if item is None:
                active.remove(person)
                continue
            label = person.choose(spec.labels, key[item.key], draws[person.username])
            queue.answer(engine, task, ids[person.username], item.item_id, label)
            answered += 1
            if answered % refit_every == 0:
                review.refresh_model(engine, task)
    return _score(engine, task, truth, accuracy)


def _score(engine: Engine, task: queue.Task, truth: dict[str, str], accuracy: dict[str, float]) -> CrowdRound:
    model, _ = review.refresh_model(engine, task)
    states = review.item_states(engine, task)
    quality = review.task_quality(engine, task, states, model)
    labels = task.spec.labels
    right = 0
    for s in states:
        if s.key in truth:
            posterior = model.posteriors[s.key]
            right += labels[posterior.index(max(posterior))] == truth[s.key]
    scored = [a for a in quality.annotators if a.gold_answered]
    return CrowdRound(
        answers=quality.answers,
        gold_answers=sum(a.gold_answered for a in quality.annotators),
        label_accuracy=right / len(truth),
        covered=sum(a.gold_accuracy_low <= accuracy[a.annotator] <= a.gold_accuracy_high for a in scored),
        scored=len(scored),
        flagged=[a.annotator for a in quality.annotators if a.flagged],
        quality=quality,
    )
