"""Layered experiments (engines.experimentation.experiments): the validator, deterministic assignment whose traffic
shares match the file (chi-square), orthogonal layers, and a simulation of twenty concurrent
experiments on the recommend request, each with a known effect on a simulated outcome: every estimate
is unbiased under layers, and the rule it replaced (the first experiment assigning a non-control
variant answers) biased them by exactly the contamination it predicts."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy.stats import chi2_contingency, chisquare

from engines.experimentation.experiments import Experiment, ExperimentConfigError, assignments, deciding, load, parse
from engines.experimentation.online_accuracy import version_mix
from simulator.concurrent_experiments import LAYERS, USERS, covered, layered_file, simulate

SEEDS = 8


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return [simulate(seed) for seed in range(SEEDS)]


def test_twenty_layered_experiments_each_estimate_their_own_effect_without_bias(runs):
    cover = Counter()
    errors: dict[str, list[float]] = {}
    for run in runs:
        for (_, version), estimate in run["layers"].items():
            cover[version] += covered(estimate, run["effects"][version])
            errors.setdefault(version, []).append((estimate[0] - run["effects"][version]) / estimate[1])
    assert len(errors) == 25  # twenty experiments, five with two treatments
    total = sum(cover.values()) / (len(cover) * SEEDS)
    assert total >= 0.9, total  # 95% intervals: 0.95 expected
    assert all(n >= SEEDS - 3 for n in cover.values()), cover
    # mean bias near zero: each arm's standardized errors average to N(0, 1/SEEDS), all of them to ~0
    assert all(abs(np.mean(z)) < 4 / np.sqrt(SEEDS) for z in errors.values()), errors
    assert abs(np.mean(list(itertools.chain(*errors.values())))) < 0.3


def test_the_first_wins_rule_biased_them_by_the_contamination(runs):
    cover, errors, predicted = [], [], []
    for run in runs:
        for (_, version), estimate in run["first_wins"].items():
            cover.append(covered(estimate, run["effects"][version]))
            errors.append(abs(estimate[0] - run["effects"][version]) / estimate[1])
            predicted.append(covered(estimate, run["contaminated"][version]))
    assert np.mean(cover) < 0.5, np.mean(cover)  # most intervals miss the true effect
    assert np.median(errors) > 3, np.median(errors)
    assert np.mean(predicted) >= 0.9, np.mean(predicted)  # and land on what the contamination predicts


def test_assignment_is_deterministic_and_shares_match_the_file():
    raw = layered_file(0)
    experiments, again = parse(raw), parse(raw)
    cells = [assignments(experiments, u) for u in range(USERS)]
    assert cells == [assignments(again, u) for u in range(USERS)]  # a fresh parse: the same arms
    assert all(cells[u] == {e.name: v.name for e in experiments if (v := e.assign(u))} for u in range(2000))
    for layer in LAYERS:
        members = [e for e in experiments if e.layer == layer]
        observed = Counter(next(((e.name, c[e.name]) for e in members if e.name in c), ("none", "")) for c in cells)
        expected = {(e.name, v.name): e.traffic * v.traffic for e in members for v in e.variants}
        expected[("none", "")] = 1 - sum(e.traffic for e in members)
        keys = [k for k, share in expected.items() if share > 1e-9]
        assert sum(observed[k] for k in keys) == USERS  # a user is in at most one experiment of a layer
        assert chisquare([observed[k] for k in keys], [expected[k] * USERS for k in keys]).pvalue > 0.001 / 3, layer


def test_layers_overlap_orthogonally():
    experiments = parse(layered_file(1))
    layer_of = {e.name: e.layer for e in experiments}
    cells = {layer: [] for layer in LAYERS}
    for user in range(USERS):
        assigned = assignments(experiments, user)
        for layer in LAYERS:
            cells[layer].append(next((n for n in assigned if layer_of[n] == layer), "none"))
    for a, b in itertools.combinations(LAYERS, 2):
        levels_a, levels_b = sorted(set(cells[a])), sorted(set(cells[b]))
        index_a, index_b = {x: i for i, x in enumerate(levels_a)}, {y: i for i, y in enumerate(levels_b)}
        table = np.zeros((len(levels_a), len(levels_b)))
        for x, y in zip(cells[a], cells[b]):
            table[index_a[x], index_b[y]] += 1
        assert chi2_contingency(table).pvalue > 0.001 / 3, (a, b)


def one_layer(**changes) -> dict:
    raw = layered_file(0)
    raw["experiments"] = [e for e in raw["experiments"] if e["layer"] == "ranking"][:2]
    raw["layers"] = raw["layers"][:1]
    for key, value in changes.items():  # None: the key is left out
        raw["experiments"][1][key] = value
        if value is None:
            del raw["experiments"][1][key]
    return raw


@pytest.mark.parametrize(
    "raw, message",
    [
        (
            one_layer(slice=[0.1, 0.3]),
            r"layer 'ranking': experiments 'e00' \[0.0, 0.12\] and 'e01' \[0.1, 0.3\] overlap",
        ),
        (one_layer(slice=[0.9, 1.2]), r"slice \[0.9, 1.2\] of layer 'ranking' must lie within \[0, 1\]"),
        (one_layer(layer="nowhere"), "layer 'nowhere' is not declared"),
        (one_layer(model="candidates"), "differs from layer 'ranking'"),
        (
            one_layer(layer=None, slice=None),
            r"decided by layer 'ranking' and by experiment 'e01' \(outside any layer\)",
        ),
    ],
)
def test_a_file_that_would_give_a_user_two_experiments_on_one_thing_is_refused(raw, message):
    with pytest.raises(ExperimentConfigError, match=message):
        parse(raw)


def test_two_layers_or_two_unlayered_experiments_on_one_model_are_refused():
    raw = one_layer()
    raw["layers"].append({"name": "ranking_two", "model": "personalization", "salt": "r2"})
    raw["experiments"][1]["layer"] = "ranking_two"
    with pytest.raises(ExperimentConfigError, match="decided by layer 'ranking' and by layer 'ranking_two'"):
        parse(raw)
    old = {"experiments": [{k: v for k, v in e.items() if k not in ("layer", "slice")} for e in raw["experiments"]]}
    with pytest.raises(ExperimentConfigError, match="experiment 'e00' .outside any layer. and by experiment 'e01'"):
        parse(old)
    old["experiments"] = old["experiments"][:1]  # one experiment alone needs no layer
    (alone,) = parse(old)
    assert alone.slice == (0.0, 1.0) and all(alone.assign(u) is not None for u in range(1000))


DEPLOYED = Path(__file__).parents[2] / "deploy" / "experiments.yaml"
VERSIONS = {"@champion": "1", "@challenger": "2", "v1": "1"}  # as the demo's registry has them


def version_mixes(experiments: list[Experiment], answering) -> dict[str, str]:
    """Each arm's served-version mix as online accuracy reports it (`version_mix`), for users answered
    by `answering(experiments, user)`: the variant that answers, None for the recommend entry (v1)."""
    rows = []
    for user in range(USERS):
        variant = answering(experiments, user)
        version = VERSIONS[variant.model_ref] if variant else "1"
        rows += [
            {"arm": f"{e}:{arm}", "model_version": version, "answers": 1}  # one answer each
            for e, arm in assignments(experiments, user).items()
        ]
    return {arm: version_mix(group) for (arm,), group in pl.DataFrame(rows).group_by("arm")}


def test_each_arm_of_the_deployed_file_is_served_its_own_version_and_the_mix_says_so():
    experiments = load(DEPLOYED)
    layered_mix = version_mixes(experiments, lambda es, u: (deciding(es, "personalization", u) or (None, None))[1])
    assert {arm: mix.split(" ")[0] for arm, mix in layered_mix.items()} == {
        "personalization_challenger:control": "v1",
        "personalization_challenger:treatment": "v2",
        "personalization_first_version:control": "v1",
        "personalization_first_version:first_version": "v1",
    }
    assert all(mix.endswith("(100.0%)") for mix in layered_mix.values()), layered_mix
    # the same experiments before layers: first_version's control was answered half by the challenger
    unlayered = [Experiment(e.name, e.model, e.salt, e.variants) for e in experiments]

    def first_non_control(es, user):
        return next((v for e in es if (v := e.assign(user)) is not e.variants[0]), None)

    old_mix = version_mixes(unlayered, first_non_control)["personalization_first_version:control"]
    assert old_mix.startswith("v") and ", " in old_mix and "v2" in old_mix, old_mix


def with_a_domain() -> dict:
    """The ranking layer outside any domain, and a domain of a fifth of the users whose own layer tries a
    second version of the same model on all of them."""
    raw = layered_file(2)
    raw["domains"] = [{"name": "rewrite", "slice": [0.0, 0.2]}]
    raw["layers"].append({"name": "ranking_rewrite", "model": "personalization", "salt": "rr-2", "domain": "rewrite"})
    variants = [
        {"name": "control", "model_alias": "champion", "traffic": 0.5},
        {"name": "rewrite", "model_version": 9, "traffic": 0.5},
    ]
    raw["experiments"].append(
        {"name": "e20", "model": "personalization", "layer": "ranking_rewrite", "salt": "e20-2", "variants": variants}
    )
    return raw


def test_a_domain_sets_its_users_apart_so_its_layer_may_decide_the_same_model():
    experiments = parse(with_a_domain())
    ranking = [e for e in experiments if e.model == "personalization"]
    cells = [[e.name for e in ranking if e.includes(u)] for u in range(USERS)]
    assert all(len(c) <= 1 for c in cells)  # one experiment decides a user's version, whichever domain
    assert all(deciding(experiments, "personalization", u) is None for u, c in enumerate(cells) if not c)
    counts = Counter(c[0] if c else "none" for c in cells)
    shares = {e.name: e.traffic for e in ranking}  # the default domain's slices shrink to its 80%
    assert shares["e20"] == pytest.approx(0.2) and shares["e00"] == pytest.approx(0.12 * 0.8)
    shares["none"] = 1 - sum(shares.values())
    assert chisquare([counts[n] for n in shares], [p * USERS for p in shares.values()]).pvalue > 0.001


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda raw: raw["domains"].append({"name": "other", "slice": [0.1, 0.3]}), "domains 'rewrite'.*overlap"),
        (lambda raw: raw["layers"][-1].update(domain="nowhere"), "domain 'nowhere' is not declared"),
        (
            lambda raw: raw["layers"].append(
                {"name": "again", "model": "personalization", "salt": "a", "domain": "rewrite"}
            ),
            "decided in domain 'rewrite' by layer 'ranking_rewrite' and by layer 'again'",
        ),
    ],
)
def test_overlapping_domains_or_two_layers_on_one_model_in_a_domain_are_refused(change, message):
    raw = with_a_domain()
    change(raw)
    with pytest.raises(ExperimentConfigError, match=message):
        parse(raw)
