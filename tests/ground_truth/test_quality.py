"""The quality figures: agreement with the resolved label leaves the annotator's own answer out, gold
questions come from an earlier release when queues are built, and each annotator's accuracy interval
from gold questions covers the accuracy the simulator gave them."""

from __future__ import annotations

import random

import polars as pl

from ground_truth import accounts, queue, review
from ground_truth import release as rel
from ground_truth.db import connect
from ground_truth.review import ItemState
from ground_truth.schema import CONTENT_VIOLATION, ItemIn
from tests.ground_truth.conftest import make_accounts

TASK = queue.Task(1, CONTENT_VIOLATION.model_copy(update={"gold_share": 0.2, "adaptive": False}))  # fixed k=3


def state(key: str, answers: dict[str, str], verdict: str | None = None, gold: dict[str, str] | None = None):
    found = ItemState(0, key, key, "", None, None, None, is_gold_question=False, answers=answers, verdict=verdict)
    found.gold_answers = gold or {}
    return found


def test_agreement_with_resolved_leaves_out_the_annotators_own_answer():
    """A coin-flipping annotator beside two careful ones, before review: with their own answer counted,
    only the unanimous items were resolved and the coin agreed with every one of them (1.0)."""
    rng = random.Random(7)
    truth = {str(i): rng.choice(["violation", "ok"]) for i in range(400)}
    states = []
    for key, label in truth.items():
        coin = rng.choice(["violation", "ok"])
        answers = {"careful0": label, "careful1": label, "coin": coin}
        states.append(state(key, answers))
    by_name = {a.annotator: a for a in review.task_quality(None, TASK, states).annotators}
    assert abs(by_name["coin"].agreement_with_resolved - 0.5) < 0.1
    assert by_name["careful0"].agreement_with_resolved == 1.0


def test_gold_questions_are_set_from_an_earlier_release_and_score_annotators(database_url):
    engine = connect(database_url)
    make_accounts(engine, 2)
    ids = {a.username: a.id for a in accounts.list_accounts(engine)}
    task = queue.create_task(engine, TASK.spec.model_copy(update={"annotators_per_item": 1, "gold_share": 0.25}))
    queue.add_items(engine, task, [ItemIn(key=str(i), queue="audit") for i in range(20)])
    while (item := queue.serve(engine, task, ids["annotator0"])) is not None:  # round one: one annotator
        queue.answer(engine, task, ids["annotator0"], item.item_id, "ok" if int(item.key) % 4 else "violation")
    states = review.item_states(engine, task)
    released = rel.candidate(task, states, review.task_quality(engine, task, states)).labels
    known = dict(released.select("key", "label").iter_rows())
    queue.add_items(engine, task, [ItemIn(key=str(i), queue="audit") for i in range(20, 40)])  # the next day
    assert queue.set_gold(engine, task, known, random.Random(1)) == 10  # a quarter of 40 items
    assert queue.set_gold(engine, task, known, random.Random(2)) == 0  # the share is reached
    draw = random.Random(4)  # seeded: which serves are gold questions is drawn at random
    while (item := queue.serve(engine, task, ids["annotator1"], draw)) is not None:
        queue.answer(engine, task, ids["annotator1"], item.item_id, "ok")
    quality = {a.annotator: a for a in review.task_quality(engine, task).annotators}
    second = quality["annotator1"]
    assert second.gold_answered > 0 and second.gold_accuracy is not None
    assert second.gold_accuracy_low <= second.gold_accuracy <= second.gold_accuracy_high
    assert quality["annotator0"].gold_answered == 0  # never shown an item they answered as gold
    gold_keys = {s.key for s in review.item_states(engine, task) if s.gold_label is not None}
    assert len(gold_keys) == 10 and gold_keys <= set(known)


def simulated_round(truth: dict[str, str], accuracy: dict[str, float], k: int, rng: random.Random):
    """Round one as the queue runs it: k distinct annotators per item; a reviewer settles disputes rightly."""

    def answer(person: str, key: str) -> str:
        return truth[key] if rng.random() < accuracy[person] else ("ok" if truth[key] == "violation" else "violation")

    states = []
    for key in truth:
        answers = {p: answer(p, key) for p in rng.sample(sorted(accuracy), k)}
        states.append(state(key, answers, verdict=truth[key] if len(set(answers.values())) > 1 else None))
    return states, answer


def test_gold_accuracy_intervals_cover_the_simulated_annotators_accuracy():
    """40 simulated annotators of known accuracy (70-99%). Round one makes a release; queue building draws
    gold questions from it; each annotator answers 80 of them. Their 95% intervals must cover their
    true accuracy for at least 90% of them (the simulator's truth; the product only saw the release)."""
    rng = random.Random(41)
    accuracy = {f"ann{i:02d}": 0.70 + 0.29 * i / 39 for i in range(40)}
    truth = {str(i): "violation" if rng.random() < 0.3 else "ok" for i in range(1500)}
    states, answer = simulated_round(truth, accuracy, CONTENT_VIOLATION.annotators_per_item, rng)
    labels: pl.DataFrame = rel.candidate(TASK, states, review.task_quality(None, TASK, states)).labels
    known = dict(labels.select("key", "label").iter_rows())
    gold = {s.key: s for s in states}
    for person in accuracy:
        unseen = [key for key in sorted(known) if person not in gold[key].answers]
        for key in rng.sample(unseen, 80):
            gold[key].gold_answers[person] = answer(person, key)
    for key, found in gold.items():
        found.gold_label = known[key]
    estimates = {a.annotator: a for a in review.task_quality(None, TASK, list(gold.values())).annotators}
    covered = [estimates[p].gold_accuracy_low <= accuracy[p] <= estimates[p].gold_accuracy_high for p in accuracy]
    print(f"gold intervals cover the true accuracy of {sum(covered)} of {len(covered)} annotators")
    assert sum(covered) >= 0.9 * len(covered)
    assert all(estimates[p].gold_answered == 80 for p in accuracy)
