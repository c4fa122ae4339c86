"""A label store made by the version before adaptive built-in tasks (no gt_models, no gt_schema_version,
the built-in tasks stored with three answers per item) is upgraded by db.connect, on SQLite and on
PostgreSQL: the built-in specs become adaptive, every item keeps at most one open slot, and no answer,
held slot, verdict, gold question or other task changes."""

from __future__ import annotations

import random
from datetime import timedelta

from sqlalchemy import MetaData, create_engine, insert, inspect, select

from ground_truth import db, migrations, queue, review
from ground_truth.schema import CONTENT_VIOLATION, RECOMMENDATION_RELEVANCE, Role

# the tables as that version created them: today's minus the ones added since
OLD_TABLES = ("gt_tasks", "gt_accounts", "gt_sessions", "gt_items", "gt_item_sources", "gt_slots", "gt_skips")
OLD_TABLES += ("gt_verdicts",)


class NoGoldDraw(random.Random):
    """Never draws a gold question (content_violation serves 10%): the test follows the regular slots."""

    def random(self) -> float:
        return 1.0


def old_spec(spec) -> dict:
    """A built-in spec as that version stored it: three answers per item, no adaptive fields."""
    fields = ("name", "subject", "question", "instructions", "labels", "show_model_score", "gold_share")
    return {**spec.model_dump(mode="json", include=set(fields)), "annotators_per_item": 3}


def make_old_store(url: str) -> tuple[dict[str, int], dict[str, int]]:
    """The old store with: a fresh item, one someone holds, one part-answered, a split one, a ruled one, a gold
    question (content_violation); a fresh pair (recommendation_relevance); a fixed-3 task of an admin's."""
    old = MetaData()
    for name in OLD_TABLES:
        db.metadata.tables[name].to_metadata(old)
    engine = create_engine(url)
    old.create_all(engine)
    moment = queue.now()
    with engine.begin() as conn:
        people = {
            name: conn.execute(
                insert(db.accounts).values(username=name, password_hash="!", role=role, created_at=moment)
            ).inserted_primary_key[0]
            for name, role in (
                ("a", Role.annotator),
                ("b", Role.annotator),
                ("c", Role.annotator),
                ("r", Role.reviewer),
            )
        }
        specs = {
            "content_violation": old_spec(CONTENT_VIOLATION),
            "recommendation_relevance": old_spec(RECOMMENDATION_RELEVANCE),
            "mine": {"name": "mine", "question": "Copy?", "labels": ["violation", "ok"], "annotators_per_item": 3},
        }
        task_ids = {
            name: conn.execute(insert(db.tasks).values(name=name, spec=spec, created_at=moment)).inserted_primary_key[0]
            for name, spec in specs.items()
        }

        def item(task: str, key: str, answers: list, gold: str | None = None) -> int:
            item_id = conn.execute(
                insert(db.items).values(
                    task_id=task_ids[task],
                    key=key,
                    title=key,
                    description="",
                    priority=0.0,
                    gold_label=gold,
                    created_at=moment,
                )
            ).inserted_primary_key[0]
            for n, (who, label) in enumerate(answers):  # (holder, label): label None is held, not answered
                conn.execute(
                    insert(db.slots).values(
                        item_id=item_id,
                        slot=None if gold else n,
                        holder=people[who] if who else None,
                        leased_until=moment + timedelta(minutes=10) if who and label is None else None,
                        label=label,
                        answered_at=moment if label else None,
                    )
                )
            return item_id

        none = (None, None)
        made = {
            "fresh": item("content_violation", "fresh", [none, none, none]),
            "held": item("content_violation", "held", [("a", None), none, none]),
            "partial": item("content_violation", "partial", [("a", "ok"), none, none]),
            "split": item("content_violation", "split", [("a", "ok"), ("b", "ok"), ("c", "violation")]),
            "ruled": item("content_violation", "ruled", [("a", "ok"), ("b", "violation"), ("c", "violation")]),
            "gold": item("content_violation", "gold", [("a", "ok")], gold="ok"),
            "pair": item("recommendation_relevance", "1:2", [none, none, none]),
            "mine": item("mine", "x", [none, none, none]),
        }
        conn.execute(
            insert(db.verdicts).values(
                item_id=made["ruled"], reviewer_id=people["r"], label="violation", decided_at=moment
            )
        )
    engine.dispose()
    return made, people


def slots_of(engine, item_id: int) -> list[tuple]:
    """(slot, holder?, label) of each of the item's slots."""
    with engine.begin() as conn:
        rows = conn.execute(
            select(db.slots.c.slot, db.slots.c.holder, db.slots.c.label)
            .where(db.slots.c.item_id == item_id)
            .order_by(db.slots.c.id)
        ).all()
    return [(r.slot, r.holder is not None, r.label) for r in rows]


def test_an_old_store_is_upgraded_to_adaptive_built_in_tasks(database_url):
    made, people = make_old_store(database_url)
    engine = db.connect(database_url)
    assert {"gt_models", "gt_schema_version"} <= set(inspect(engine).get_table_names())
    with engine.begin() as conn:
        assert conn.execute(select(db.schema_version.c.version)).scalars().all() == [2]
    # the assets' create_task finds the spec they ask for (it refused another spec before)
    violation = queue.create_task(engine, CONTENT_VIOLATION)
    assert (
        queue.create_task(engine, RECOMMENDATION_RELEVANCE).spec.answers_rule == "adaptive, until 90% sure or 5 answers"
    )
    assert queue.get_task(engine, "mine").spec.adaptive is False
    assert slots_of(engine, made["fresh"]) == [(0, False, None)]
    assert slots_of(engine, made["held"]) == [(0, True, None)]
    assert slots_of(engine, made["partial"]) == [(0, True, "ok"), (1, False, None)]
    assert slots_of(engine, made["split"]) == [(0, True, "ok"), (1, True, "ok"), (2, True, "violation")]
    assert slots_of(engine, made["ruled"]) == [(0, True, "ok"), (1, True, "violation"), (2, True, "violation")]
    assert slots_of(engine, made["gold"]) == [(None, True, "ok")]
    assert slots_of(engine, made["pair"]) == [(0, False, None)]
    assert slots_of(engine, made["mine"]) == [(0, False, None), (1, False, None), (2, False, None)]
    states = {s.key: s for s in review.item_states(engine, violation)}
    assert states["ruled"].verdict == "violation" and states["gold"].is_gold_question
    assert migrations.upgrade(engine) == []  # once only
    engine.dispose()
    again = db.connect(database_url)
    assert slots_of(again, made["fresh"]) == [(0, False, None)]
    # and it asks adaptively, by the prior model before a fit: one answer is 80% sure, two agreeing 94%
    served = queue.serve(again, violation, people["b"], NoGoldDraw())
    assert served.key == "fresh"
    queue.answer(again, violation, people["b"], served.item_id, "ok")
    assert slots_of(again, made["fresh"]) == [(0, True, "ok"), (1, False, None)]
    served = queue.serve(again, violation, people["b"], NoGoldDraw())
    assert served.key == "partial"  # "held" is a's
    queue.answer(again, violation, people["b"], served.item_id, "ok")
    assert slots_of(again, made["partial"]) == [(0, True, "ok"), (1, True, "ok")]
    again.dispose()
