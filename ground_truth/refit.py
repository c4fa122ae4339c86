"""The annotator model refitted while annotators work, so that an adaptive task stops asking by the
accuracies shown in today's answers, not those of the last release or the queue asset's morning run.

A fit is due when the task's answers have grown since the last fit by `growth` of what that fit saw, and
by at least `min_new_answers`. Growth by a share keeps the cost bounded: fits come at answer counts that
rise geometrically, so all fits of a round together cost a fixed multiple of the last one (at most
(1 + growth) / growth, 11 at 10%, plus the first few small fits) instead of growing with the square of the
answers, as a fit every N answers would. The app
checks on one background thread (`Refitter`) every `check_seconds`: never on a request's thread, one fit
at a time. A simulation calls `refit_if_due` after each answer to the same effect."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from ground_truth import queue, review
from ground_truth.db import items, models, slots

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefitPolicy:
    min_new_answers: int = 30  # a fit on fewer new answers would move nothing
    growth: float = 0.1  # ... and at least this share of the answers the last fit saw
    check_seconds: float = 10.0  # how often the app's refitter looks at the answer counts

    def due(self, answers: int, fitted_on: int | None) -> bool:
        if fitted_on is None:
            return answers >= self.min_new_answers
        return answers - fitted_on >= max(self.min_new_answers, self.growth * fitted_on)


def answer_counts(engine: Engine, task: queue.Task) -> tuple[int, int | None]:
    """(answers now, answers the stored model was fitted on or None): two indexed counts, cheap to poll."""
    with engine.begin() as conn:
        answered = conn.execute(
            select(func.count())
            .select_from(slots.join(items, items.c.id == slots.c.item_id))
            .where(items.c.task_id == task.id, slots.c.answered_at.is_not(None))
        ).scalar_one()
        fitted_on = conn.execute(select(models.c.answers).where(models.c.task_id == task.id)).scalar()
    return answered, fitted_on


def refit_if_due(engine: Engine, task: queue.Task, policy: RefitPolicy) -> dict[str, int] | None:
    """Refit, store and rebalance (review.refresh_model) an adaptive task's model when the policy says so;
    returns what the rebalance did, or None when no fit was due."""
    if not task.spec.adaptive or not policy.due(*answer_counts(engine, task)):
        return None
    _, rebalanced = review.refresh_model(engine, task)
    return rebalanced


class Refitter:
    """The app's background refitter: a daemon thread that checks every adaptive task each
    `policy.check_seconds` and refits the ones that are due."""

    def __init__(self, engine: Engine, policy: RefitPolicy):
        self.engine, self.policy = engine, policy
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="annotator-model-refit", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def check_once(self) -> int:
        """One pass over the adaptive tasks; returns how many were refitted."""
        return sum(refit_if_due(self.engine, task, self.policy) is not None for task in queue.list_tasks(self.engine))

    def _run(self) -> None:
        while not self._stop.wait(self.policy.check_seconds):
            try:
                self.check_once()
            except Exception:  # a failed pass (the database away) must not end the thread; the next one retries
                log.exception("refitting the annotator models failed; trying again in %ss", self.policy.check_seconds)
