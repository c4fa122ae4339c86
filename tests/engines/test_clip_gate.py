"""CLIP's registry gate by simulation: per-item held-out hits of a champion and a candidate drawn with known
recall@10, paired on the same items (an item easy for one model tends to be easy for the other)."""

import numpy as np

from engines.retrieval.clip_registry import CHALLENGER, CHAMPION, GateVerdict, assign_alias, gate

ITEMS = 300


def paired_hits(rng, champion_recall: float, candidate_recall: float) -> tuple[np.ndarray, np.ndarray]:
    ease = rng.random(ITEMS)  # shared: the same item is easy or hard for both models
    noise = 0.3 * rng.random((2, ITEMS))
    score = 0.7 * ease + noise
    # each model's hits are the items above its own quantile, so each recall is as set
    champion = (score[0] >= np.quantile(score[0], 1 - champion_recall)).astype(float)
    candidate = (score[1] >= np.quantile(score[1], 1 - candidate_recall)).astype(float)
    return champion, candidate


def test_without_a_champion_the_first_version_is_champion():
    verdict = gate(np.ones(5), None, np.arange(5))
    assert verdict.alias == CHAMPION and verdict.comparison is None


def test_an_equal_candidate_is_rarely_promoted_and_a_better_one_usually_is():
    """Equal recall: promoted in at most about the one-sided 2.5% of the test (plus simulation noise);
    recall 0.40 against 0.30 on 300 items: promoted in most runs."""
    rng = np.random.default_rng(40)
    ids = np.arange(ITEMS)
    runs = 100
    equal = [gate(*reversed(paired_hits(rng, 0.3, 0.3)), ids).alias for _ in range(runs)]
    better = [gate(*reversed(paired_hits(rng, 0.3, 0.4)), ids).alias for _ in range(runs)]
    false_promotions = equal.count(CHAMPION) / runs
    assert false_promotions <= 0.025 + 2 * np.sqrt(0.025 * 0.975 / runs), false_promotions
    assert better.count(CHAMPION) / runs >= 0.8, better.count(CHAMPION) / runs
    assert set(equal + better) <= {CHAMPION, CHALLENGER}


class Registry:
    """The registry calls the alias step makes: who holds an alias, and moving it."""

    def __init__(self, held: dict[str, str]):
        self.held, self.moves = dict(held), []

    def by_alias(self, name, alias):
        version = self.held.get(alias)
        return None if version is None else type("Version", (), {"version": version})()

    def set_alias(self, name, alias, version, who, reason):
        self.moves.append((alias, version, who))
        self.held[alias] = version


def test_the_verdicts_alias_moves_to_the_new_version_only_when_it_points_elsewhere():
    verdict = GateVerdict(CHALLENGER, "not shown better", None)
    registry = Registry({CHAMPION: "1", CHALLENGER: "2"})
    assign_alias(registry, "3", verdict, who="run a")
    assign_alias(registry, "3", verdict, who="run b")  # the same version again: nothing to move
    assert registry.moves == [(CHALLENGER, "3", "run a")] and registry.held == {CHAMPION: "1", CHALLENGER: "3"}
    fresh = Registry({})
    assign_alias(fresh, "1", GateVerdict(CHAMPION, "no champion yet", None), who="run c")
    assert fresh.held == {CHAMPION: "1"}
