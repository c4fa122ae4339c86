"""A labeling round by simulated annotators and a reviewer through the labeling app's HTTP API, as
people's browsers call it (`mlplane labeling simulate` and the demo). Their accounts are made here; the
answer key stays in the simulator (simulator/annotators.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Engine

REVIEWER = "sim-rev0"
TASK = "content_violation"  # the simulator's answer key covers this task only


@dataclass(frozen=True)
class LabelingRound:
    answers: int
    disputes_settled: int


def simulated_round(labels: Engine, url: str, data_dir: Path, annotators: int, accuracy: float) -> LabelingRound:
    """Annotators sim-ann0..N-1 of `accuracy` label every item of the content_violation task they may
    still answer, at once; then sim-rev0 settles the disputes. Passwords: $MLPLANE_LABELING_PASSWORD
    (default 'simulated-pass')."""
    from ground_truth import accounts, queue
    from simulator.annotators import (
        SimulatedAnnotator,
        SimulatedReviewer,
        run_concurrently,
        violation_answer_key,
    )

    password = os.environ.get("MLPLANE_LABELING_PASSWORD", "simulated-pass")
    names = [f"sim-ann{i}" for i in range(annotators)]
    known = {a.username for a in accounts.list_accounts(labels)}
    for name in [*names, REVIEWER]:
        if name not in known:
            role = accounts.Role.reviewer if name == REVIEWER else accounts.Role.annotator
            accounts.create_account(labels, name, password, role)
    label_set = queue.get_task(labels, TASK).spec.labels
    key = violation_answer_key(data_dir)
    people = [SimulatedAnnotator(n, password, accuracy, seed=i) for i, n in enumerate(names)]
    answered = run_concurrently([lambda p=p: p.label_all(url, TASK, key) for p in people])
    settled = SimulatedReviewer(REVIEWER, password).review_all(url, TASK, key, label_set)
    return LabelingRound(sum(answered), settled)
