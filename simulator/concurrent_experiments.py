"""Twenty concurrent experiments on the recommend request, each with a known effect, for the proof that
layered assignment (engines.experimentation.experiments) gives each its own unbiased estimate
(tests/engines/test_experiment_layers.py, benchmarks/experiments.py).

The twenty sit in three layers, one per model a recommend request uses (ranking, retrieval,
presentation), each layer's experiments on disjoint slices; every fourth has two treatments. Each
treatment version has its own effect on a user's outcome (uniform 0.1 to 0.3, random sign, against the
champion's 0), and a user's outcome adds the effects of the versions that served them, one per model,
plus N(0, 1) noise. Each arm is compared with its control by intent to treat. The same users and effects
are run again under the rule layers replaced (`first_wins`: the first experiment on a model, in file
order, that assigns a user a non-control variant answers), whose bias `contaminated` predicts."""

from __future__ import annotations

import numpy as np

from engines.experimentation.experiments import Experiment, assignments, deciding, parse

USERS = 20_000
# Layer -> the model whose version it decides, and its experiments' slice widths: twenty experiments.
LAYERS = {
    "ranking": ("personalization", [0.12, 0.1, 0.08, 0.1, 0.09, 0.06, 0.1, 0.08, 0.07, 0.1]),
    "retrieval": ("candidates", [0.15, 0.15, 0.2, 0.1, 0.15, 0.15]),
    "presentation": ("thumbnails", [0.25, 0.2, 0.3, 0.2]),
}


def layered_file(seed: int) -> dict:
    """The twenty experiments in their layers, packed from bucket 0; every fourth has two treatments.
    Variant versions are "<experiment>-<arm>" so each treatment's effect is its own."""
    layers, experiments = [], []
    for layer, (model, widths) in LAYERS.items():
        layers.append({"name": layer, "model": model, "salt": f"{layer}-{seed}"})
        start = 0.0
        for width in widths:
            i = len(experiments)
            variants = [{"name": "control", "model_alias": "champion", "traffic": 0.5}]
            treatments = ["a", "b"] if i % 4 == 3 else ["a"]
            share = 0.5 / len(treatments)
            variants += [{"name": t, "model_version": f"e{i:02d}-{t}", "traffic": share} for t in treatments]
            experiments.append(
                {
                    "name": f"e{i:02d}",
                    "model": model,
                    "layer": layer,
                    "slice": [round(start, 4), round(start + width, 4)],
                    "salt": f"e{i:02d}-{seed}",
                    "variants": variants,
                }
            )
            start += width
    return {"layers": layers, "experiments": experiments}


def true_effects(rng: np.random.Generator, experiments: list[Experiment]) -> dict[str, float]:
    """Each treatment's version -> its effect on the outcome against the champion (0)."""
    return {
        v.model_version: float(rng.choice([-1, 1]) * rng.uniform(0.1, 0.3)) for e in experiments for v in e.variants[1:]
    }


def first_wins(experiments: list[Experiment], model: str, user: int) -> str | None:
    """The served version under the old rule: the first experiment on `model` (file order) that assigns
    the user a non-control variant answers; None is the champion."""
    for e in experiments:
        if e.model == model:
            variant = e.assign(user)
            if variant is not e.variants[0]:
                return variant.model_version
    return None


def layered(experiments: list[Experiment], model: str, user: int) -> str | None:
    """The served version under layers: the variant of the one experiment that decides `model`."""
    decided = deciding(experiments, model, user)
    return decided[1].model_version if decided else None


def estimates(experiments, serve, effects, rng, users: int = USERS) -> dict[tuple[str, str], tuple[float, float]]:
    """Each treatment arm against its control (intent to treat): (difference of means, standard error),
    on an outcome that adds the effect of every version the user is served, one per model."""
    models = sorted({e.model for e in experiments})
    arms: dict[tuple[str, str], list[float]] = {}
    for user in range(users):
        served = [serve(experiments, model, user) for model in models]
        outcome = sum(effects[v] for v in served if v is not None) + rng.normal()
        for name, variant in assignments(experiments, user).items():
            arms.setdefault((name, variant), []).append(outcome)
    result = {}
    for e in experiments:
        control = np.array(arms[(e.name, e.variants[0].name)])
        for v in e.variants[1:]:
            treated = np.array(arms[(e.name, v.name)])
            se = np.sqrt(treated.var(ddof=1) / len(treated) + control.var(ddof=1) / len(control))
            result[(e.name, v.model_version)] = (treated.mean() - control.mean(), se)
    return result


def contaminated(experiments: list[Experiment], effects: dict[str, float]) -> dict[str, float]:
    """What the old rule's comparison of each arm with its control estimates: for arm a of experiment k,
    P(every earlier experiment on the model assigns control) * (effect of a - mean effect of the later
    experiments' first non-control variant, which the control arm was served instead)."""
    expected = {}
    for model in {e.model for e in experiments}:
        chain = [e for e in experiments if e.model == model]
        for k, e in enumerate(chain):
            earlier_control = np.prod([c.variants[0].traffic for c in chain[:k]])
            later, reach = 0.0, 1.0
            for other in chain[k + 1 :]:
                later += reach * sum(v.traffic * effects[v.model_version] for v in other.variants[1:])
                reach *= other.variants[0].traffic
            for v in e.variants[1:]:
                expected[v.model_version] = earlier_control * (effects[v.model_version] - later)
    return expected


def simulate(seed: int, users: int = USERS) -> dict[str, dict]:
    """One run: the known effects, the layered estimates, the first-wins estimates on the same users, and
    the first-wins bias the contamination predicts."""
    experiments = parse(layered_file(seed))
    rng = np.random.default_rng(seed)
    effects = true_effects(rng, experiments)
    unlayered = [Experiment(e.name, e.model, e.salt, e.variants, e.description) for e in experiments]
    return {
        "effects": effects,
        "layers": estimates(experiments, layered, effects, rng, users),
        "first_wins": estimates(unlayered, first_wins, effects, rng, users),
        "contaminated": contaminated(unlayered, effects),
    }


def covered(estimate: tuple[float, float], truth: float, z: float = 1.96) -> bool:
    difference, se = estimate
    return abs(difference - truth) <= z * se
