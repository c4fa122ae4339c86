"""The held-out promotion gate (`offline_verdict`, `promote_approved`) on simulated models whose truth is
known: every row has a click probability, a model scores it with noise of its own. Two seeds of one
model are a tie and must stay a challenger (at most the stated one-sided 2.5%, where "challenger >=
champion" promoted about half of them); a model with less noise is a real gain and is promoted; a loss
beyond the margin on any gated metric refuses it; nothing promotes without an approval."""

from __future__ import annotations

import numpy as np
import pytest

from assets.pipelines import APPROVED_ALIAS, offline_verdict, promote_approved
from ml.comparison import delong, paired_bootstrap

USERS, ROWS_PER_USER = 200, 10


def simulated_world(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's true click logit, its label drawn from it, and its user."""
    rng = np.random.default_rng(seed)
    logit = rng.normal(-1.5, 1.0, USERS * ROWS_PER_USER)
    labels = rng.random(len(logit)) < 1 / (1 + np.exp(-logit))
    return logit, labels, np.repeat(np.arange(USERS), ROWS_PER_USER)


def model_scores(logit: np.ndarray, noise: float, seed: int) -> np.ndarray:
    """A model that knows the truth up to its own noise (a seed: another training of the same model)."""
    return logit + np.random.default_rng(seed).normal(0, noise, len(logit))


def top_hit(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per user: whether its highest-scored row was clicked (a per-user ranking metric)."""
    per_user = scores.reshape(USERS, ROWS_PER_USER)
    return labels.reshape(USERS, ROWS_PER_USER)[np.arange(USERS), per_user.argmax(axis=1)].astype(float)


def comparisons(seed: int, champion_noise: float, challenger_noise: float, ranking: bool = False) -> dict:
    logit, labels, _ = simulated_world(seed)
    a = model_scores(logit, champion_noise, 10_000 + seed)
    b = model_scores(logit, challenger_noise, 20_000 + seed)
    found = {"auc": delong(labels, a, b)}
    if ranking:
        found["hit@1"] = paired_bootstrap(top_hit(a, labels), top_hit(b, labels), users=np.arange(USERS), seed=seed)
    return found


def test_two_seeds_of_one_model_are_a_tie_and_stay_challengers():
    runs = [comparisons(seed, 1.0, 1.0) for seed in range(300)]
    promoted = sum(offline_verdict(c, "auc", margin=0.01).passed for c in runs)
    old_rule = sum(c["auc"].estimate_b >= c["auc"].estimate_a for c in runs)  # any difference, ties included
    assert promoted <= 15, promoted  # one-sided 2.5% of 300 is 7.5; 15 is beyond 2.8 standard deviations
    assert old_rule > 100, old_rule  # about half: what the gate decided on before
    tie = offline_verdict(runs[0], "auc", margin=0.05)  # within the margin, but not better
    assert tie.passed is False and tie.reason.startswith("auc not shown better than the champion")


def test_a_real_gain_is_promoted():
    runs = [comparisons(seed, 1.5, 0.5, ranking=seed < 5) for seed in range(40)]
    verdicts = [offline_verdict(c, "auc", margin=0.05) for c in runs]
    assert sum(v.passed for v in verdicts) >= 38, [v.reason for v in verdicts if not v.passed]
    assert all(v.passed for v in verdicts[:5])  # with a per-user ranking metric judged beside AUC
    assert "better" in verdicts[0].reason and "| hit@1 |" in verdicts[0].table().value


def test_a_loss_beyond_the_margin_on_any_gated_metric_refuses_a_better_primary():
    gain = comparisons(1, 1.5, 0.5)
    logit, labels, _ = simulated_world(1)
    good, bad = model_scores(logit, 0.2, 1), model_scores(logit, 3.0, 2)  # the challenger ranks much worse
    worse = paired_bootstrap(top_hit(good, labels), top_hit(bad, labels), users=np.arange(USERS))
    verdict = offline_verdict({**gain, "hit@1": worse}, "auc", margin=0.01)
    assert gain["auc"].low > 0 and not verdict.passed
    assert verdict.reason.startswith("hit@1: may be worse by more than 0.01")
    with pytest.raises(ValueError, match="'ndcg' is not among"):
        offline_verdict(gain, "ndcg", margin=0.01)


class Registry:
    """Aliases only: what promote_approved reads and moves."""

    def __init__(self, **aliases):
        self.aliases = {alias: type("Version", (), {"version": v}) for alias, v in aliases.items()}

    def by_alias(self, name, alias):
        return self.aliases.get(alias)

    def set_alias(self, name, alias, version, who, reason):
        self.aliases[alias] = type("Version", (), {"version": version})


def test_nothing_promotes_without_an_approval_not_even_the_challenger():
    registry = Registry(champion="1", challenger="2")
    with pytest.raises(ValueError, match="no version approved"):
        promote_approved(registry, "m", "run")
    assert registry.aliases["champion"].version == "1"
    registry.aliases[APPROVED_ALIAS] = type("Version", (), {"version": "2"})
    promote_approved(registry, "m", "run")
    assert registry.aliases["champion"].version == "2"
