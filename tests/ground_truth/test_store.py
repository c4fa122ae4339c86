"""The label store on SQLite and on the real PostgreSQL: accounts, tasks, serving, k, skip, undo,
gold questions, review; and 20 annotators at once through the HTTP API losing nothing."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import select

from ground_truth import accounts, queue, review
from ground_truth.db import accounts as accounts_table
from ground_truth.db import connect, slots
from ground_truth.schema import ItemIn, Role, TaskSpec
from simulator.annotators import SimulatedAnnotator, run_concurrently
from tests.ground_truth.conftest import PASSWORD, add_task, make_accounts, serve_app

SPEC = TaskSpec(name="violation", question="Copy?", labels=["violation", "ok"], annotators_per_item=2, gold_share=0.0)


def ids(engine, names):
    with engine.begin() as conn:
        rows = conn.execute(select(accounts_table.c.username, accounts_table.c.id)).all()
    found = dict(rows)
    return [found[n] for n in names]


def test_passwords_are_hashed_and_sessions_expire_with_sign_out(database_url):
    engine = connect(database_url)
    accounts.create_account(engine, "ann", PASSWORD, Role.annotator)
    with engine.begin() as conn:
        stored = conn.execute(select(accounts_table.c.password_hash)).scalar()
    assert PASSWORD not in stored and stored.startswith("scrypt$")
    assert accounts.sign_in(engine, "ann", "wrong password") is None
    assert accounts.sign_in(engine, "nobody", PASSWORD) is None
    token = accounts.sign_in(engine, "ann", PASSWORD)
    assert accounts.account_for(engine, token).role == Role.annotator
    accounts.sign_out(engine, token)
    assert accounts.account_for(engine, token) is None
    with pytest.raises(accounts.AccountExists):
        accounts.create_account(engine, "ann", PASSWORD, Role.admin)
    with pytest.raises(ValueError, match="at least 8"):
        accounts.create_account(engine, "bob", "short", Role.admin)


def test_items_get_k_answers_skip_and_undo(database_url):
    engine = connect(database_url)
    a, b, c = ids(engine, make_accounts(engine, 3)["annotator"])
    task = add_task(engine, SPEC, ["1", "2"])
    assert queue.add_items(engine, task, [ItemIn(key="1", queue="flagged")]) == 0  # idempotent, new source only
    first = queue.serve(engine, task, a)
    assert queue.serve(engine, task, a).item_id == first.item_id  # the held item until answered
    assert first.model_score is None  # this task hides the model's score
    queue.answer(engine, task, a, first.item_id, "ok")
    with pytest.raises(queue.Conflict, match="already answered"):
        queue.answer(engine, task, a, first.item_id, "violation")
    with pytest.raises(ValueError, match="label must be one of"):
        queue.answer(engine, task, a, queue.serve(engine, task, a).item_id, "maybe")
    second = queue.serve(engine, task, a)
    assert second.item_id != first.item_id
    queue.skip(engine, task, a, second.item_id)
    assert queue.serve(engine, task, a) is None  # answered one, skipped the other
    undone = queue.undo(engine, task, a)
    assert undone.item_id == first.item_id
    queue.answer(engine, task, a, first.item_id, "violation")
    for person in (b, c):  # item 1 takes one more answer, item 2 two
        while (item := queue.serve(engine, task, person)) is not None:
            queue.answer(engine, task, person, item.item_id, "ok")
    states = {s.key: s for s in review.item_states(engine, task)}
    assert len(states["1"].answers) == 2 and len(states["2"].answers) == 2
    assert states["1"].answers["annotator0"] == "violation"
    assert [s.key for s in review.disputes(engine, task)] == ["1"]
    reviewer = ids(engine, ["reviewer0"])[0]
    review.adjudicate(engine, task, reviewer, states["1"].item_id, "violation")
    with pytest.raises(queue.Conflict, match="already has a verdict"):
        review.adjudicate(engine, task, reviewer, states["1"].item_id, "ok")
    states = {s.key: s for s in review.item_states(engine, task)}
    assert states["1"].resolved_label(2) == "violation" and states["2"].resolved_label(2) == "ok"
    assert states["1"].gold_label is None  # a verdict makes no gold question: queue.set_gold draws them


def test_gold_questions_are_mixed_in_and_score_annotators(database_url):
    engine = connect(database_url)
    (a,) = ids(engine, make_accounts(engine, 1)["annotator"])
    spec = SPEC.model_copy(update={"name": "gold", "gold_share": 0.25})  # a quarter of serves, drawn at random
    task = add_task(engine, spec, [str(i) for i in range(8)], gold={"g1": "violation", "g2": "ok"})
    served, rng = [], random.Random(3)  # seeded: this draw serves both gold questions, at positions 0 and 4
    while (item := queue.serve(engine, task, a, rng)) is not None:
        served.append(item.key)
        queue.answer(engine, task, a, item.item_id, "violation")
    assert [i for i, k in enumerate(served) if k.startswith("gold")] == [0, 4]
    assert sorted(k for k in served if k.startswith("gold")) == ["gold-g1", "gold-g2"]
    quality = review.task_quality(engine, task)
    (person,) = quality.annotators
    assert (person.gold_answered, person.gold_accuracy, person.answers) == (2, 0.5, 8)
    assert quality.items == 8  # gold questions are not part of the labelled items


@pytest.mark.parametrize("k", [3])
def test_twenty_concurrent_annotators_lose_nothing_and_never_exceed_k(database_url, k):
    engine = connect(database_url)
    names = make_accounts(engine, 20)["annotator"]
    keys = [str(i) for i in range(40)]
    task = add_task(engine, SPEC.model_copy(update={"annotators_per_item": k}), keys)
    truth = {key: ("violation" if int(key) % 3 == 0 else "ok") for key in keys}
    people = [SimulatedAnnotator(n, PASSWORD, accuracy=0.8, seed=i) for i, n in enumerate(names)]
    with serve_app(database_url) as base_url:
        counts = run_concurrently([lambda p=p: p.label_all(base_url, task.spec.name, truth) for p in people])
    assert sum(counts) == len(keys) * k  # every slot filled, none twice
    with engine.begin() as conn:
        rows = conn.execute(
            select(slots.c.item_id, slots.c.holder, slots.c.label).where(slots.c.answered_at.is_not(None))
        ).all()
    per_item: dict[int, int] = {}
    for row in rows:
        per_item[row.item_id] = per_item.get(row.item_id, 0) + 1
    assert set(per_item.values()) == {k}
    stored = {(r.holder, r.item_id): r.label for r in rows}
    person_id = dict(zip(names, ids(engine, names), strict=True))
    sent = {(person_id[p.username], item): label for p in people for item, label in p.answers.items()}
    assert stored == sent  # every acknowledged answer is stored, as sent, and nothing else


def test_free_text_tasks_take_text_and_raise_no_disputes(database_url):
    engine = connect(database_url)
    a, b = ids(engine, make_accounts(engine, 2)["annotator"])
    spec = TaskSpec(name="describe", question="Describe the item", labels=None, annotators_per_item=2, gold_share=0)
    task = add_task(engine, spec, ["1"])
    with pytest.raises(ValueError, match="1-2000 characters"):
        queue.answer(engine, task, a, queue.serve(engine, task, a).item_id, "   ")
    for person, text in ((a, "a red teapot"), (b, "a teapot, red")):
        queue.answer(engine, task, person, queue.serve(engine, task, person).item_id, text)
    (state,) = review.item_states(engine, task)
    assert state.answers == {"annotator0": "a red teapot", "annotator1": "a teapot, red"}
    assert review.disputes(engine, task) == []
    assert review.task_quality(engine, task).krippendorff_alpha is None  # agreement is for label sets


def test_answer_and_next_claim_commit_together_or_not_at_all(database_url):
    engine = connect(database_url)
    a, b = ids(engine, make_accounts(engine, 2)["annotator"])
    task = add_task(engine, SPEC, ["1", "2", "3"])
    first = queue.serve(engine, task, a)
    with pytest.raises(ValueError, match="label must be one of"):  # a bad answer claims nothing either
        queue.answer_and_serve(engine, task, a, first.item_id, "maybe")
    with engine.begin() as conn:
        assert conn.execute(select(slots.c.item_id).where(slots.c.holder == a)).scalars().all() == [first.item_id]
    with pytest.raises(queue.Conflict, match="not assigned to you"):
        queue.answer_and_serve(engine, task, b, first.item_id, "ok")
    nxt, retry = queue.answer_and_serve(engine, task, a, first.item_id, "ok")
    assert not retry and nxt.item_id not in (None, first.item_id)
    assert queue.serve(engine, task, a).item_id == nxt.item_id  # the next item is held, as serve() holds it
    states = {s.item_id: s for s in review.item_states(engine, task)}
    assert states[first.item_id].answers == {"annotator0": "ok"}


def test_a_store_made_before_the_serving_index_gets_it(tmp_path):
    from sqlalchemy import inspect

    from ground_truth.db import ITEMS_BY_PRIORITY

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = connect(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX {ITEMS_BY_PRIORITY.name}")
    engine.dispose()
    engine = connect(url)
    assert ITEMS_BY_PRIORITY.name in {i["name"] for i in inspect(engine).get_indexes("gt_items")}
