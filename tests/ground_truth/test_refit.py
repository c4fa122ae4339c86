"""The annotator model refitted while annotators work (ground_truth/refit.py), proven with a simulated
crowd whose accuracies only the simulator knows: the refits' accuracy estimates converge toward the
truth, and the built-in adaptive rule ("until 90% sure or 5 answers") stopping by the current model labels
as accurately as a fixed three answers per item with at least 25% fewer answers, and its confident labels
are right at least as often as it claims. Also: when a fit is due, and the app's background refitter."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from sqlalchemy import select

from ground_truth import accounts, queue, review
from ground_truth.db import connect, models
from ground_truth.refit import RefitPolicy, Refitter, refit_if_due
from ground_truth.schema import CONTENT_VIOLATION, ItemIn, TaskSpec
from ground_truth.server import serve_app
from simulator.annotators import SimulatedAnnotator
from simulator.crowd import add_annotators, crowd
from tests.ground_truth.conftest import add_task, login, make_accounts

LABELS = ["violation", "ok"]
BUILT_IN_RULE = {"adaptive": True, "confidence": 0.9, "max_answers": 5}  # as CONTENT_VIOLATION asks


def test_built_in_rule_is_what_the_simulation_runs():
    assert {k: getattr(CONTENT_VIOLATION, k) for k in BUILT_IN_RULE} == BUILT_IN_RULE


def test_a_fit_is_due_after_enough_new_answers_and_a_share_more():
    policy = RefitPolicy(min_new_answers=30, growth=0.1)
    assert not policy.due(29, None) and policy.due(30, None)
    assert not policy.due(59, 30) and policy.due(60, 30)  # 30 new: the minimum
    assert not policy.due(1099, 1000) and policy.due(1100, 1000)  # 10% of 1000
    fitted: list[int] = []  # the answer counts the fits saw, over a round of 10,000 answers
    for answers in range(1, 10_001):
        if policy.due(answers, fitted[-1] if fitted else None):
            fitted.append(answers)
    # a fit costs about its answers: all fits together cost at most (1 + growth) / growth = 11 times the last
    # (a fit every 30 answers: 333 fits, 170 times the last)
    assert sum(fitted) <= 11 * fitted[-1] and len(fitted) < 50


@dataclass
class Round:
    task: queue.Task
    answers: int = 0  # regular answers, gold questions not counted
    estimate_errors: list[float] = field(default_factory=list)  # per refit: mean |estimated - true accuracy|


def labelling_round(engine, spec, truth, gold, ids, accuracy, seed, policy: RefitPolicy | None) -> Round:
    """The crowd answers in a shuffled round robin through the queue until nothing is left for anyone.
    After each answer the refitter's check runs (the app's thread does it every few seconds); with no
    policy the model is never refitted while they work (the prior alone, as before this change)."""
    task = queue.create_task(engine, spec)
    queue.add_items(engine, task, [ItemIn(key=k, queue="audit") for k in truth])
    queue.add_items(engine, task, [ItemIn(key=k, queue="seeded_gold", gold_label=v) for k, v in gold.items()])
    rng, key, found = random.Random(seed), {**truth, **gold}, Round(task)
    people = [SimulatedAnnotator(name, "", accuracy[name], seed=seed) for name in sorted(accuracy)]
    draws = {p.username: random.Random(f"{seed}:{p.username}") for p in people}
    active = list(people)
    while active:
        rng.shuffle(active)
        for person in list(active):
            item = queue.serve(engine, task, ids[person.username], rng)
            if item is None:
                active.remove(person)
                continue
            queue.answer(
                engine,
                task,
                ids[person.username],
                item.item_id,
                person.choose(LABELS, key[item.key], draws[person.username]),
            )
            found.answers += item.key in truth
            if policy is not None and refit_if_due(engine, task, policy) is not None:
                with engine.begin() as conn:
                    model = queue.load_model(conn, task)
                found.estimate_errors.append(
                    statistics.mean(abs(model.accuracy(p) - accuracy[p]) for p in model.confusion)
                )
    return found


def label_accuracy(engine, found: Round, truth: dict[str, str]) -> tuple[float, float, int]:
    """(accuracy of the final model's most likely label, accuracy of the labels it is at least as sure of
    as the task's confidence, how many those are), against the simulator's answer key."""
    model, _ = review.refresh_model(engine, found.task)
    best = {k: LABELS[p.index(max(p))] for k, p in model.posteriors.items() if k in truth}
    sure = [k for k, p in model.posteriors.items() if k in truth and max(p) >= found.task.spec.confidence]
    right = sum(best[k] == truth[k] for k in truth) / len(truth)
    return right, sum(best[k] == truth[k] for k in sure) / len(sure), len(sure)


def one_seed(tmp_path, seed: int, policies: dict[str, tuple[dict, RefitPolicy | None]]) -> dict:
    """600 items (30% violations), 100 seeded gold questions, 20 annotators of 70-95% (the simulator's), the
    same for each policy -> {policy: (round, (accuracy, sure accuracy, sure count))}."""
    engine = connect(f"sqlite:///{tmp_path / f'labels{seed}.db'}")
    accuracy = crowd(20, 0.70, 0.95)
    ids = add_annotators(engine, accuracy)
    rng = random.Random(seed)
    truth = {str(i): "violation" if rng.random() < 0.3 else "ok" for i in range(600)}
    gold = {f"gold{i}": "violation" if rng.random() < 0.3 else "ok" for i in range(100)}
    found = {}
    for name, (rule, policy) in policies.items():
        spec = TaskSpec(name=name, question="Copy?", labels=LABELS, gold_share=0.1, **rule)
        run = labelling_round(engine, spec, truth, gold, ids, accuracy, seed, policy)
        found[name] = (run, label_accuracy(engine, run, truth))
        right, sure_right, sure = found[name][1]
        print(f"seed {seed} {name}: {run.answers} answers, accuracy {right:.4f}; {sure} >= 90% sure, {sure_right:.4f}")
    engine.dispose()
    return found


def test_refits_converge_and_adaptive_answers_beat_fixed_three(tmp_path):
    """Two seeds, three policies on the first: fixed three answers; adaptive by the built-in rule with the
    model refitted as they work; adaptive with no refit while they work (the prior's 80% for everyone).
    Deterministic: everything is seeded."""
    refitting = RefitPolicy(min_new_answers=30, growth=0.1)
    fixed, refitted, stale = ({}, None), (BUILT_IN_RULE, refitting), (BUILT_IN_RULE, None)
    first = one_seed(tmp_path, 5, {"fixed3": fixed, "refitted": refitted, "stale": stale})
    second = one_seed(tmp_path, 6, {"fixed3": fixed, "refitted": refitted})
    for found in (first, second):
        errors = found["refitted"][0].estimate_errors
        print(f"{len(errors)} refits; mean |estimated - true accuracy| after each: {[round(e, 3) for e in errors]}")
        # the estimates converge toward the simulator's accuracies (about 70 answers each: a binomial's
        # sampling error alone is about 0.04)
        quarter = len(errors) // 4
        assert len(errors) >= 8 and errors[-1] < 0.05 and errors[-1] < 0.7 * errors[0]
        assert statistics.mean(errors[-quarter:]) < statistics.mean(errors[:quarter])
        # what the model claims at the rule's 90% holds: its confident labels are right at least 90% of the time
        _, sure_right, sure = found["refitted"][1]
        assert sure_right >= 0.9 and sure >= 0.9 * 600
        # as accurate as fixed-3 (more, in fact: a split gets more answers), on fewer answers
        assert found["refitted"][1][0] >= found["fixed3"][1][0]
        assert found["fixed3"][0].answers == 3 * 600
    answers = {name: sum(found[name][0].answers for found in (first, second)) for name in ("fixed3", "refitted")}
    print(f"over both seeds: refitted {answers['refitted']} answers, fixed-3 {answers['fixed3']}")
    assert answers["refitted"] <= 0.75 * answers["fixed3"]
    # stopping by the current model, not the prior, is what saves the answers
    assert first["refitted"][0].answers < first["stale"][0].answers


def test_the_refitter_refits_only_adaptive_tasks_that_are_due(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'labels.db'}")
    people = make_accounts(engine, 2)["annotator"]
    adaptive = add_task(
        engine, TaskSpec(name="adaptive", question="Copy?", labels=LABELS, gold_share=0, adaptive=True), ["a", "b", "c"]
    )
    fixed = add_task(engine, TaskSpec(name="fixed", question="Copy?", labels=LABELS, gold_share=0), ["a", "b", "c"])
    refitter = Refitter(engine, RefitPolicy(min_new_answers=3))
    ids = {a.username: a.id for a in accounts.list_accounts(engine)}
    for task in (adaptive, fixed):
        for _ in range(3):
            item = queue.serve(engine, task, ids[people[0]])
            queue.answer(engine, task, ids[people[0]], item.item_id, "ok")
    assert refitter.check_once() == 1  # the adaptive task; the fixed one asks no model
    assert refitter.check_once() == 0  # nothing new
    with engine.begin() as conn:
        assert conn.execute(select(models.c.task_id, models.c.answers)).all() == [(adaptive.id, 3)]


def test_the_app_refits_while_annotators_work(tmp_path):
    """The app's background thread refits an adaptive task once enough answers came in over HTTP."""
    url = f"sqlite:///{tmp_path / 'labels.db'}"
    engine = connect(url)
    (person,) = make_accounts(engine, 1)["annotator"]
    add_task(
        engine,
        TaskSpec(name="adaptive", question="Copy?", labels=LABELS, gold_share=0, adaptive=True),
        [str(i) for i in range(6)],
    )
    with serve_app(url, refit=RefitPolicy(min_new_answers=4, check_seconds=0.1)) as base, login(base, person) as client:
        item = client.get("/api/tasks/adaptive/next").json()["item"]
        for _ in range(4):
            item = client.post("/api/tasks/adaptive/answers", json={"item_id": item["item_id"], "label": "ok"}).json()[
                "item"
            ]
        deadline = time.monotonic() + 60  # a wait for the thread, not a speed claim
        while time.monotonic() < deadline:
            with engine.begin() as conn:
                fitted = conn.execute(select(models.c.answers)).scalar()
            if fitted is not None:
                break
            time.sleep(0.1)
    assert fitted == 4
