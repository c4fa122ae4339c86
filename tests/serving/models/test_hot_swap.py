"""Alias moves in the registry (promotion, rollback) reach the server under load without a failed
request; a version that fails its checksums leaves the previous one serving and says why."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from engines.models.registry import CHECKSUMS_FILE, ModelRegistry
from serving.models.config import ServerConfig
from tests.serving.models.conftest import TOWER_ENTRIES, register_two_tower, start_server
from tests.serving.models.test_protocol import valid_body


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "condition not reached in time"
        time.sleep(0.05)


def served_version(url: str) -> str:
    return httpx.get(f"{url}/v2/models/personalization", timeout=30).json()["versions"][0]


def tamper(registry: ModelRegistry, version: str) -> None:
    """Change one byte of a registered artifact file in the artifact store (corruption at rest)."""
    run_id = registry.get("personalization", version).run_id
    folder = Path(registry.client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "model"
    weights = next(p for p in folder.iterdir() if p.name != CHECKSUMS_FILE and p.suffix == ".pt")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))


@pytest.mark.services  # a server under load
def test_alias_moves_under_load_drop_nothing_and_a_corrupt_version_keeps_the_previous(tmp_path):
    import tritonclient.http as triton

    registry = ModelRegistry.local(tmp_path / "registry")
    register_two_tower(registry, tmp_path, seed=1, alias="champion")
    v2 = register_two_tower(registry, tmp_path, seed=2, alias="challenger")
    config = ServerConfig(
        registry_root=str(tmp_path / "registry"),
        lake_root=str(tmp_path / "lake"),
        models=TOWER_ENTRIES,
        poll_interval_s=0.1,
        feature_log_sample=0.0,
    )
    running = start_server(config)
    try:
        body = valid_body(triton.InferenceServerClient(running.url.removeprefix("http://")))
        seen, failures, stop = [], [], threading.Event()

        def load() -> None:
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    response = client.post(f"{running.url}/v2/models/personalization/infer", json=body)
                    if response.status_code != 200:
                        failures.append(response.text)
                    else:
                        seen.append(response.json()["model_version"])

        threads = [threading.Thread(target=load) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_for(lambda: len(seen) > 20)
        registry.set_alias("personalization", "champion", v2, who="test", reason="promote")
        wait_for(lambda: served_version(running.url) == v2 and seen[-1] == v2)
        registry.rollback("personalization", "champion", who="test", reason="roll back under load")
        wait_for(lambda: served_version(running.url) == "1" and seen[-1] == "1")

        v3 = register_two_tower(registry, tmp_path, seed=3)
        tamper(registry, v3)
        registry.set_alias("personalization", "champion", v3, who="test", reason="corrupt promotion")
        index = {}
        wait_for(
            lambda: (
                index.update({m["name"]: m for m in httpx.post(f"{running.url}/v2/repository/index").json()})
                or "failed to load" in index["personalization"]["reason"]
            )
        )
        count = len(seen)
        wait_for(lambda: len(seen) > count + 20)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert failures == []
        assert {"1", v2} == set(seen)  # the corrupt v3 never answered
        reason = index["personalization"]["reason"]
        assert f"v{v3} failed to load" in reason and "CorruptArtifactError" in reason and "still serving v1" in reason
        assert index["personalization"]["version"] == "1" and served_version(running.url) == "1"
    finally:
        running.stop()
