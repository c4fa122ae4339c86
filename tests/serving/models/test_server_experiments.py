"""A/B experiments in the model server: variants by alias or version served by real registry models,
sticky assignment across twenty concurrent experiments in two layers (chi-square: each experiment's
arms, each layer's slices, the layers' independence), each arm served its own variant, a changed file
swapped in under load without a failed request, and an invalid file refused with the reason while the
running configuration stays."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import numpy as np
import pytest
import yaml
from scipy.stats import chi2_contingency, chisquare

from serving.models.config import ServerConfig
from serving.models.server import ModelServer
from tests.serving.models.conftest import TOWER_ENTRIES, start_server
from tests.serving.models.test_hot_swap import wait_for

USERS = range(20_000)
TREATMENTS = [
    ("challenger", {"model_alias": "challenger"}),
    ("first", {"model_version": 1}),
    ("second", {"model_version": 2}),
]


def twenty() -> dict:
    """Twenty experiments in two layers: twelve on the personalization model's version, with different
    slices, splits and variant counts, and eight on another model (assigned and logged, not served here)."""
    layers = [
        {"name": "ranking", "model": "personalization", "salt": "ranking-1"},
        {"name": "retrieval", "model": "candidates", "salt": "retrieval-1"},
    ]
    experiments, starts = [], {"ranking": 0.0, "retrieval": 0.0}
    for i in range(20):
        layer, width = ("ranking", 0.07 + 0.002 * i) if i < 12 else ("retrieval", 0.11)
        name, ref = TREATMENTS[i % 3]
        variants = [
            {"name": "control", "model_alias": "champion", "traffic": 0.5 + 0.02 * i},
            {"name": name, **ref, "traffic": round(0.5 - 0.02 * i, 2)},
        ]
        if i % 4 == 3:  # a three-way split
            variants[1]["traffic"] = round(variants[1]["traffic"] / 2, 3)
            variants.append(
                {"name": "third", "model_version": 2, "traffic": round(0.5 - 0.02 * i, 2) - variants[1]["traffic"]}
            )
        model = "personalization" if layer == "ranking" else "candidates"
        start = starts[layer]
        starts[layer] = round(start + width, 4)
        experiments.append(
            {
                "name": f"exp_{i:02d}",
                "model": model,
                "layer": layer,
                "slice": [start, starts[layer]],
                "salt": f"s{i}",
                "variants": variants,
            }
        )
    return {"layers": layers, "experiments": experiments}


def server_over(tower_registry, tmp_path, raw: dict) -> ModelServer:
    _, root = tower_registry
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = ServerConfig(
        registry_root=str(root / "registry"),
        lake_root=str(tmp_path / "lake"),
        models=TOWER_ENTRIES,
        feature_log_sample=0.0,
        experiments_file=str(path),
        prediction_log=False,
    )
    server = ModelServer(config)
    server.repository.refresh()
    assert server.experiments.reload(), server.experiments.reason
    return server


def experiments_in_use(url: str) -> dict:
    return httpx.get(f"{url}/v2/experiments", timeout=30).json()


def test_twenty_experiments_assign_stickily_by_traffic_and_independently(tower_registry, tmp_path):
    raw = twenty()
    server = server_over(tower_registry, tmp_path, raw)
    try:
        router = server.experiments
        routes = [router.choose(u, {}) for u in USERS]
        assert routes == [router.choose(u, {}) for u in USERS]  # sticky: the same user, the same route
        for experiment in raw["experiments"]:
            arms = Counter(r.assignments[experiment["name"]] for r in routes if experiment["name"] in r.assignments)
            names = [v["name"] for v in experiment["variants"]]
            users = sum(arms.values())
            expected = [v["traffic"] * users for v in experiment["variants"]]
            assert chisquare([arms[n] for n in names], expected).pvalue > 0.001 / 20, experiment["name"]
        for layer in raw["layers"]:  # each layer's users split by its experiments' slices, none in two
            members = [e for e in raw["experiments"] if e["layer"] == layer["name"]]
            cells = [[e["name"] for e in members if e["name"] in r.assignments] for r in routes]
            assert all(len(c) <= 1 for c in cells), layer["name"]
            counts = Counter(c[0] if c else "none" for c in cells)
            shares = {e["name"]: e["slice"][1] - e["slice"][0] for e in members}
            shares["none"] = 1 - sum(shares.values())
            observed, expected = [counts[n] for n in shares], [p * len(USERS) for p in shares.values()]
            assert chisquare(observed, expected).pvalue > 0.001 / 2, layer["name"]
        # the two layers overlap orthogonally: the experiment and arm in one say nothing of the other
        table = Counter(tuple(cell_of(r, layer["name"], raw) for layer in raw["layers"]) for r in routes)
        rows, columns = sorted({a for a, _ in table}), sorted({b for _, b in table})
        contingency = np.array([[table[(a, b)] for b in columns] for a in rows])
        assert chi2_contingency(contingency).pvalue > 0.001
        assert_each_arm_is_served_its_own_version(server, raw, routes)
        assert {"personalization@v1", "personalization@v2"} <= set(server.repository.states)
        described = router.describe()
        assert [layer["name"] for layer in described["layers"]] == ["ranking", "retrieval"]
        assert described["experiments"][1]["slice"] == raw["experiments"][1]["slice"]
        # a file whose slices overlap in a layer is refused, the layer and experiments named
        digest = router.snapshot.digest
        raw["experiments"][1]["slice"] = [0.05, 0.2]
        router.path.write_text(yaml.safe_dump(raw))
        assert not router.reload()
        assert "layer 'ranking': experiments 'exp_00'" in router.reason and "'exp_01'" in router.reason
        assert router.snapshot.digest == digest
    finally:
        server.close()


def cell_of(route, layer: str, raw: dict) -> str:
    """The route's experiment and arm in `layer` ("none" outside every slice)."""
    names = [e["name"] for e in raw["experiments"] if e["layer"] == layer and e["name"] in route.assignments]
    return f"{names[0]}:{route.assignments[names[0]]}" if names else "none"


def assert_each_arm_is_served_its_own_version(server, raw: dict, routes) -> None:
    """A user in a ranking experiment is answered by that experiment's variant, whatever the other
    experiments assign; a user in none by the recommend model's own entry (the champion)."""
    aliases = {a: server.registry.by_alias("personalization", a).version for a in ("champion", "challenger")}
    ranking = [e for e in raw["experiments"] if e["layer"] == "ranking"]
    for route in routes[:3000]:
        mine = [e for e in ranking if e["name"] in route.assignments]
        served = server.repository.get(route.model)
        if not mine:
            assert (route.experiment, route.model, served.version) == ("", "personalization", aliases["champion"])
            continue
        (experiment,) = mine
        variant = next(v for v in experiment["variants"] if v["name"] == route.assignments[experiment["name"]])
        assert (route.experiment, route.variant) == (experiment["name"], variant["name"])
        expected = str(variant["model_version"]) if "model_version" in variant else aliases[variant["model_alias"]]
        assert served.version == expected, (experiment["name"], variant["name"])


@pytest.mark.services  # a server under load
def test_a_changed_file_swaps_in_under_load_and_an_invalid_one_is_refused_with_the_reason(tower_registry, tmp_path):
    _, root = tower_registry
    path = tmp_path / "experiments.yaml"
    one = {
        "experiments": [
            {
                "name": "ab",
                "model": "personalization",
                "salt": "ab-1",
                "variants": [
                    {"name": "control", "model_alias": "champion", "traffic": 0.5},
                    {"name": "treatment", "model_alias": "challenger", "traffic": 0.5},
                ],
            }
        ]
    }
    path.write_text(yaml.safe_dump(one))
    config = ServerConfig(
        registry_root=str(root / "registry"),
        lake_root=str(tmp_path / "lake"),
        models=TOWER_ENTRIES,
        poll_interval_s=0.1,
        feature_log_sample=0.0,
        experiments_file=str(path),
        prediction_log=False,
    )
    running = start_server(config)
    server = running.server
    failures, seen, stop = [], set(), threading.Event()

    def requests() -> None:  # the request path's routing and model lookup, as recommend does them
        user = 0
        while not stop.is_set():
            user += 1
            time.sleep(0.0005)  # lets the GIL go: four spinning threads starved the server's loop past 5 s (CI)
            try:
                route = server.experiments.choose(user, {})
                seen.add((route.experiment, route.variant, server.repository.get(route.model).version))
            except Exception as error:  # noqa: BLE001 - counted, the test fails on any
                failures.append(repr(error))

    workers = [threading.Thread(target=requests) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: {("ab", "treatment", "2"), ("ab", "control", "1")} <= seen)
        two = yaml.safe_load(yaml.safe_dump(one))
        two["layers"] = [{"name": "ranking", "model": "personalization", "salt": "r-1"}]
        two["experiments"][0].update(salt="ab-2", layer="ranking", slice=[0.5, 1.0])
        two["experiments"].insert(
            0,
            {
                "name": "pinned",
                "model": "personalization",
                "layer": "ranking",
                "slice": [0.0, 0.5],
                "salt": "p-1",
                "variants": [
                    {"name": "control", "model_alias": "champion", "traffic": 0.8},
                    {"name": "v2", "model_version": 2, "traffic": 0.2},
                ],
            },
        )
        path.write_text(yaml.safe_dump(two))
        wait_for(lambda: ("pinned", "v2", "2") in seen)
        described = experiments_in_use(running.url)
        assert [e["name"] for e in described["experiments"]] == ["pinned", "ab"] and described["reason"] == ""
        digest = described["digest"]

        bad = yaml.safe_load(yaml.safe_dump(two))
        bad["experiments"][1]["variants"][0]["traffic"] = 0.7  # sums to 1.2
        path.write_text(yaml.safe_dump(bad))
        wait_for(lambda: "sums to" in experiments_in_use(running.url)["reason"])
        missing = yaml.safe_load(yaml.safe_dump(two))
        missing["experiments"][0]["variants"][1]["model_version"] = 99  # not in the registry
        path.write_text(yaml.safe_dump(missing))
        wait_for(lambda: "'pinned' variant 'v2'" in experiments_in_use(running.url)["reason"])
        described = experiments_in_use(running.url)
        assert described["digest"] == digest  # the valid configuration kept serving throughout
        assert "personalization@v99" not in server.repository.states
        assert httpx.get(f"{running.url}/v2/health/ready").status_code == 200
    finally:
        stop.set()
        for w in workers:
            w.join()
        running.stop()
    assert not failures, failures[:3]


def test_the_configuration_in_use_is_the_bytes_its_digest_was_taken_from(tower_server, tmp_path, monkeypatch):
    """A file rewritten in place is empty for a moment. A read that sees it empty refuses it; the written
    configuration comes in at the next read, under its own digest (CI once saw the empty file's digest
    on a valid configuration, parsed from a second read)."""
    import hashlib
    from pathlib import Path

    from serving.models.hooks.experiments import ExperimentRouter

    path = tmp_path / "experiments.yaml"
    variants = [
        {"name": "control", "model_alias": "champion", "traffic": 0.5},
        {"name": "treatment", "model_alias": "challenger", "traffic": 0.5},
    ]
    path.write_text(
        yaml.safe_dump({"experiments": [{"name": "ab", "model": "personalization", "salt": "s", "variants": variants}]})
    )
    told = []
    router = ExperimentRouter(path, tower_server.server.repository, "personalization", lambda *file: told.append(file))
    read_bytes, reads = Path.read_bytes, []

    def first_read_mid_write(self: Path) -> bytes:  # the writer finishes right after the first read
        reads.append(self)
        return b"" if reads.count(path) == 1 and self == path else read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", first_read_mid_write)
    assert not router.reload()  # the empty moment
    assert router.snapshot.digest == "" and "expected a mapping" in router.reason
    monkeypatch.undo()
    assert router.reload()
    assert router.snapshot.digest == hashlib.sha256(path.read_bytes()).hexdigest()[:16] and router.reason == ""
    assert [e.name for e in router.snapshot.experiments] == ["ab"]
    # the prediction log is handed the file before any route names it, and every route names it
    assert told == [(router.snapshot.digest, path.read_bytes())] and router.choose(7, {}).config == told[0][0]


@pytest.mark.services  # a server and the CLI
def test_a_rollback_through_the_cli_is_visible_in_the_server(tmp_path, monkeypatch):
    """`mlplane models rollback` (the real command, in this process) moves `champion` back; the server, which
    follows the alias, serves the earlier version at its next poll: polled through its metadata."""
    from click.testing import CliRunner

    from cli.main import main
    from engines.models.registry import ModelRegistry
    from tests.serving.models.conftest import register_two_tower

    monkeypatch.setenv("MLPLANE_PROFILE", "local")
    registry = ModelRegistry.local(tmp_path / "registry")
    register_two_tower(registry, tmp_path, seed=1, alias="champion")
    register_two_tower(registry, tmp_path, seed=2, alias="challenger")
    registry.set_alias("personalization", "champion", "2", who="test", reason="promoted")
    config = ServerConfig(
        registry_root=str(tmp_path / "registry"),
        lake_root=str(tmp_path),
        models=TOWER_ENTRIES,
        poll_interval_s=0.5,
        feature_log_sample=0.0,
        prediction_log=False,
    )
    running = start_server(config)
    try:

        def served() -> str:
            return httpx.get(f"{running.url}/v2/models/personalization").json()["versions"][0]

        assert served() == "2"
        result = CliRunner().invoke(
            main, ["models", "rollback", "--reason", "CTR drop online", "--who", "oncall", "--data-dir", str(tmp_path)]
        )
        assert result.exit_code == 0, result.output
        wait_for(lambda: served() == "1", timeout=30)  # the poll interval is 0.5 s
        assert registry.by_alias("personalization", "champion").version == "1"
    finally:
        running.stop()
