"""Shadows and the prediction log through the running server's `POST /recommend`: a shadow that hangs
and one that raises never change or hold up the live answer, and every live and shadow answer lands in
the lake's prediction log with what was served, checked against a brute-force recomputation.

The server runs real two-tower models from a real MLflow registry, real Feast (SQLite online store) and
the real embedded vector store. The item catalogue is handed to each loaded version (ItemIndex.build and
the vector index, the code the loader runs over the lake's item features) instead of being read from a
lake, which would need the whole daily pipeline. The hanging and failing shadows are the real versions
wrapped to wait on an event or raise: the thing under test is the server's handling of them."""

from __future__ import annotations

import dataclasses
import json
import threading

import httpx
import numpy as np
import polars as pl
import pytest
import yaml

from engines.experimentation.prediction_logs import SHADOW, inputs_hash, read_spool, spool_days
from serving.models.config import ServerConfig
from serving.models.kinds.towers import ItemIndex, TwoTowerModel
from tests.serving.models.conftest import TOWER_ENTRIES, register_two_tower, start_server
from tests.serving.models.test_hot_swap import wait_for

ITEMS = pl.DataFrame(
    {
        "item_id": list(range(100, 160)),
        # a price of its own per item: no two items tie, whatever the matrix kernel's rounding
        "item_content__price": [float(i * 7 % 60) for i in range(60)],
        "item_content__category": [["art", "game", "toy"][i % 3] for i in range(60)],
    }
)
AB = {
    "name": "ab",
    "model": "personalization",
    "salt": "ab-shadow",
    "variants": [
        {"name": "control", "model_alias": "champion", "traffic": 0.5},
        {"name": "treatment", "model_alias": "challenger", "traffic": 0.5},
    ],
}
SHADOWS = [
    {"name": "slow", "model": "personalization", "model_alias": "slow"},
    {"name": "broken", "model": "personalization", "model_alias": "broken"},
]


class Hanging(TwoTowerModel):
    """The registered version, waiting for `gate` before it computes."""

    def __init__(self, base: TwoTowerModel, gate: threading.Event):
        self.__dict__.update(base.__dict__)
        self.gate = gate

    def user_vectors(self, columns):
        self.gate.wait()
        return super().user_vectors(columns)


class Broken(TwoTowerModel):
    def __init__(self, base: TwoTowerModel):
        self.__dict__.update(base.__dict__)

    def user_vectors(self, columns):
        raise RuntimeError("the shadow model broke")


def give_catalogue(server) -> None:
    for state in server.repository.states.values():
        served = state.current.model
        served.items = ItemIndex.build(served.model, ITEMS)
        server.vectors.index(served, ITEMS, state.current.version)


def brute_force_top_k(served: TwoTowerModel, features: dict, k: int) -> tuple[list[int], np.ndarray]:
    """Every catalogue item scored with the model's own towers (no vector database), best k."""
    user = pl.DataFrame({c: [features.get(c)] for c in served.model.spec.user.columns})
    scores = served.model.item_vectors(ITEMS) @ served.model.user_vectors(user)[0]
    order = np.lexsort((ITEMS["item_id"].to_numpy(), -scores))[:k]  # the server's tie-break: item id
    return ITEMS["item_id"].to_numpy()[order].tolist(), scores[order]


@pytest.fixture()
def shadowed(tmp_path):
    from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings
    from engines.models.registry import ModelRegistry

    registry = ModelRegistry.local(tmp_path / "registry")
    register_two_tower(registry, tmp_path, seed=1, alias="champion")
    register_two_tower(registry, tmp_path, seed=2, alias="challenger")
    registry.set_alias("personalization", "slow", "2", who="test", reason="shadow")
    registry.set_alias("personalization", "broken", "1", who="test", reason="shadow")
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": [AB], "shadows": SHADOWS}))
    config = ServerConfig(
        registry_root=str(tmp_path / "registry"),
        lake_root=str(tmp_path / "lake"),
        models=TOWER_ENTRIES,
        poll_interval_s=0.2,
        feature_log_sample=0.0,
        experiments_file=str(path),
        prediction_log_flush_s=0.1,
        shadow_workers=2,
    )
    FeatureStoreEngine(
        FeatureStoreSettings(repo_dir=tmp_path / "lake" / "feature_repo", offline_root=tmp_path / "lake" / "offline")
    ).apply()  # no rows: nulls
    running = start_server(config)
    give_catalogue(running.server)
    yield running, path, tmp_path / "lake"
    running.stop()


@pytest.mark.services  # a server
def test_shadows_that_hang_or_fail_never_change_or_hold_up_the_live_answer(shadowed):
    running, path, lake = shadowed
    server, states = running.server, running.server.repository.states
    gate = threading.Event()
    slow, broken = states["personalization@slow"], states["personalization@broken"]
    slow.current = dataclasses.replace(slow.current, model=Hanging(slow.current.model, gate))
    broken.current = dataclasses.replace(broken.current, model=Broken(broken.current.model))

    users = list(range(1, 41))
    with httpx.Client(base_url=running.url, timeout=120) as client:
        shadowed_answers = {u: client.post("/recommend", json={"user_id": u, "k": 5}).json() for u in users}
        # every live answer came back while the slow shadow has not computed a single one
        assert not gate.is_set()
        assert all(a.get("items") for a in shadowed_answers.values()), list(shadowed_answers.values())[:2]
        server.prediction_log.flush()
        so_far = pl.concat([read_spool(lake, d) for d in spool_days(lake)])
        assert so_far.filter(pl.col("variant") == "slow").is_empty()
        assert so_far.filter(pl.col("role") == "live").height == len(users)

        path.write_text(yaml.safe_dump({"experiments": [AB]}))  # the same experiment without shadows
        wait_for(lambda: not client.get("/v2/experiments").json()["shadows"])
        plain = {u: client.post("/recommend", json={"user_id": u, "k": 5}).json() for u in users}
    read = server.recommender.features.read
    features = {u: {k: v[0] for k, v in read("personalization_ranking", [u]).items()} for u in users}
    for u in users:  # the answer with shadows is the answer without them
        a, b = shadowed_answers[u], plain[u]
        assert (a["items"], a["scores"], a["model_version"], a["variant"]) == (
            b["items"],
            b["scores"],
            b["model_version"],
            b["variant"],
        )
    gate.set()
    running.stop()  # a clean stop: shadows in flight finish and the log writes everything

    log = pl.concat([read_spool(lake, d) for d in spool_days(lake)])
    live = log.filter(pl.col("role") == "live")
    assert live.height == 2 * len(users) and live["request_id"].n_unique() == live.height
    by_request = {r["request_id"]: r for r in live.iter_rows(named=True)}
    for u, answer in shadowed_answers.items():
        record = by_request[answer["request_id"]]
        assert (record["user_id"], record["item_ids"], record["experiment"], record["variant"]) == (
            u,
            answer["items"],
            "ab",
            answer["variant"],
        )
        assert json.loads(record["assignments"]) == {"ab": answer["variant"]}
        served = states[TOWER_ENTRIES[0].name if answer["variant"] == "control" else TOWER_ENTRIES[1].name]
        ids, scores = brute_force_top_k(served.current.model, features[u], 5)
        assert record["item_ids"] == ids and record["model_version"] == answer["model_version"]
        np.testing.assert_allclose(record["scores"], scores, rtol=1e-4, atol=1e-5)
        assert record["latency_ms"] > 0 and record["inputs"] is None  # the card does not allow logging inputs
        shadows = log.filter((pl.col("request_id") == answer["request_id"]) & (pl.col("role") == SHADOW))
        assert sorted(shadows["variant"]) == ["broken", "slow"]
        slow_row = shadows.filter(pl.col("variant") == "slow").row(0, named=True)
        assert slow_row["status"] == "ok" and slow_row["model_version"] == "2"
        assert (
            slow_row["item_ids"]
            == brute_force_top_k(states["personalization-challenger"].current.model, features[u], 5)[0]
        )
        assert (
            slow_row["inputs_hash"]
            == record["inputs_hash"]
            == inputs_hash(  # the same request, copied
                {"user_id": u, "k": 5, "context": {}, "features": features[u]}
            )
        )
        broken_row = shadows.filter(pl.col("variant") == "broken").row(0, named=True)
        assert broken_row["status"] == "error" and "the shadow model broke" in broken_row["error"]
