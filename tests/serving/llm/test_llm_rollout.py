"""LLM versions in the registry (lineage, aliases), gateway deployments by registry reference, speculative
decoding backends, and a promotion rolled under load without a failed request. One rollout controller
for the module runs every vLLM server here (real vLLM, CPU build)."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import httpx
import pytest
import yaml

from engines.models.llm_registry import LlmLineage, LlmReference, materialize_llm, register_llm
from engines.models.registry import file_checksums
from tests.serving.conftest import DRAFTED, NGRAM, ROLLED, GatewayProcess

pytestmark = pytest.mark.services

PROMPTS = [
    "a red wooden chair",
    "Hello, is this item still for sale?",
    "low poly castle with towers",
    "Can you ship it",
]


def test_llm_and_draft_registered_with_lineage(
    gateway_llm_lake, gateway_llm_path, gateway_llm_draft_path, llm_registry
):
    registry = llm_registry
    from engines.data.lake import Lake

    target = registry.get("gateway_llm", "1")
    draft = registry.get("gateway_llm_draft", "1")
    tokenizer_hash = hashlib.sha256((gateway_llm_path / "tokenizer.json").read_bytes()).hexdigest()
    assert target.tags["mlplane.tokenizer_sha256"] == tokenizer_hash
    assert draft.tags["mlplane.tokenizer_sha256"] == tokenizer_hash
    assert draft.tags["mlplane.draft_for"] == "gateway_llm/1"
    lake = Lake(gateway_llm_lake)
    partitions = json.loads(target.tags["mlplane.data_partitions"])
    for table in ("chat_messages", "items"):
        days = [d.isoformat() for d in lake.partition_days("warehouse", table)]
        assert partitions[f"warehouse/{table}"]["days"] == len(days) == 2
        assert (partitions[f"warehouse/{table}"]["first"], partitions[f"warehouse/{table}"]["last"]) == (
            days[0],
            days[-1],
        )
    trained = json.loads((gateway_llm_path / "mlplane_training.json").read_text())
    assert float(target.tags["metric.held_out_perplexity"]) == pytest.approx(trained["held_out_perplexity"], 1e-5)
    draft_trained = json.loads((gateway_llm_draft_path / "mlplane_training.json").read_text())
    assert draft_trained["parameters"] < trained["parameters"]
    assert {"challenger", "champion"} <= set(target.aliases)
    # a reference resolves to the registered bytes
    resolved = materialize_llm(registry, LlmReference.parse("gateway_llm@champion"), gateway_llm_lake / "cache")
    assert resolved.version.version == "1"
    assert file_checksums(resolved.path) == file_checksums(gateway_llm_path)


def test_speculative_backends_answer_exactly_as_the_plain_one_at_temperature_zero(llm_deployments):
    gateway, controller = llm_deployments
    key = gateway.key()
    answers = {}
    for model in (ROLLED, DRAFTED, NGRAM):
        answers[model] = [chat(gateway, key, model, prompt, max_tokens=24) for prompt in PROMPTS]
    assert all(len(a["choices"][0]["message"]["content"]) > 0 for a in answers[ROLLED])
    texts = {m: [a["choices"][0]["message"]["content"] for a in v] for m, v in answers.items()}
    assert texts[DRAFTED] == texts[ROLLED]
    assert texts[NGRAM] == texts[ROLLED]
    for name in (DRAFTED, NGRAM):  # speculation really ran: tokens were proposed and some accepted
        metrics = controller.served[f"{name}@default"].servers[0].metrics()
        assert metrics["vllm:spec_decode_num_draft_tokens_total"] > 0, name
        assert metrics["vllm:spec_decode_num_accepted_tokens_total"] > 0, name


def test_promotion_rolls_the_backends_under_load_without_a_failed_request(
    llm_deployments, llm_registry, gateway_llm_path
):
    gateway, controller = llm_deployments
    registry = llm_registry
    key = gateway.key()
    before = controller.served[f"{ROLLED}@eu"]
    lineage = LlmLineage(
        {}, hashlib.sha256((gateway_llm_path / "tokenizer.json").read_bytes()).hexdigest(), "test", "test"
    )
    v2 = register_llm(registry, "gateway_llm", gateway_llm_path, lineage, {"held_out_perplexity": 1.0})
    statuses: list[int] = []
    stop = threading.Event()

    def load():
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                response = client.post(
                    f"{gateway.url}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": ROLLED, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]},
                )
                statuses.append(response.status_code)
                stop.wait(0.2)  # steady traffic that leaves the 2 CPUs to the new version's start

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(2)
        registry.set_alias("gateway_llm", "champion", v2.version, who="test", reason="promotion under load")
        events = controller.step()
        served_before = len(statuses)
        time.sleep(2)
    finally:
        stop.set()
        for worker in workers:
            worker.join(120)
    assert [(e["deployment"], e["action"], e["version"]) for e in events] == [
        (f"{ROLLED}@eu", "rolled", f"gateway_llm/{v2.version}")
    ]
    assert len(statuses) > served_before > 0
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    assert not any(server.alive() for server in before.servers)  # the old version was stopped
    listed = yaml.safe_load(gateway.config_path.read_text())["model_list"]
    rolled = [e for e in listed if e["model_name"] == ROLLED]
    assert [e["registry_version"] for e in rolled] == [f"gateway_llm/{v2.version}"]
    by_backend = gateway.admin("GET", "/admin/usage", params={"group_by": "model,backend,status"}).json()["data"]
    urls = {r["backend"] for r in by_backend if r["model"] == ROLLED and r["status"] == 200}
    assert {before.servers[0].url, rolled[0]["url"]} <= urls  # both versions answered part of the load


def test_a_version_that_cannot_start_leaves_the_running_one_serving(
    llm_deployments, llm_registry, gateway_llm_path, tmp_path
):
    gateway, controller = llm_deployments
    registry = llm_registry
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in gateway_llm_path.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "hidden_size": config["hidden_size"] * 2}))
    serving = controller.served[f"{ROLLED}@eu"].version
    version = register_llm(registry, "gateway_llm", broken, LlmLineage({}, "x", "test", "test"), {})
    registry.set_alias("gateway_llm", "champion", version.version, who="test", reason="a broken version")
    events = controller.step()
    assert [(e["action"], e["version"]) for e in events] == [("failed", f"gateway_llm/{version.version}")]
    assert controller.served[f"{ROLLED}@eu"].version == serving
    assert chat(gateway, gateway.key(), ROLLED, "hello", max_tokens=4)["choices"]
    assert controller.step() == []  # the failed version is not retried until the alias moves again


def chat(gateway: GatewayProcess, key: str, model: str, prompt: str, max_tokens: int) -> dict:
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
        json={
            "model": model,
            "temperature": 0,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": prompt}],
        },
    )
    assert response.status_code == 200, response.text
    return response.json()
