"""The rollout controller's deployments on vLLM (the rolled model, a draft-model and an n-gram speculative
backend) behind a gateway. Package-scoped: the servers stop when tests/serving/llm is done."""

from __future__ import annotations

import pytest

from serving.gateway.rollout import Rollout
from tests.serving.conftest import ADMIN_KEY, DRAFTED, NGRAM, ROLLED, GatewayProcess


@pytest.fixture(scope="package")
def llm_deployments(llm_registry, gateway_llm_lake, tmp_path_factory):
    """A gateway whose model_list only the rollout controller fills: the rolled model (alias champion)
    and the same version with a draft model and with n-gram speculation."""
    workdir = tmp_path_factory.mktemp("rollout")
    args = ["--max-model-len", "256", "--enforce-eager"]  # no graph compile at start: the model is tiny
    config = {
        "deployments": [
            {
                "model_name": ROLLED,
                "registry": "gateway_llm@champion",
                "region": "eu",
                "capacity": 64,
                "max_tokens": 16,
                "vllm_args": args,
            },
            {
                "model_name": DRAFTED,
                "registry": "gateway_llm/1",
                "max_tokens": 32,
                "vllm_args": args,
                "speculative": {
                    "method": "draft_model",
                    "draft": "gateway_llm_draft@champion",
                    "num_speculative_tokens": 3,
                },
            },
            {
                "model_name": NGRAM,
                "registry": "gateway_llm/1",
                "max_tokens": 32,
                "vllm_args": args,
                "speculative": {"method": "ngram", "num_speculative_tokens": 3},
            },
        ],
        "settings": {
            "store": f"sqlite:///{workdir}/gateway.db",
            "key_cache_s": 0,
            "health_interval_s": 1,
            "reload_interval_s": 0.5,
            "connect_timeout_s": 2,
        },
    }
    gateway = GatewayProcess(config, workdir)
    controller = Rollout(gateway.config_path, llm_registry, workdir / "models", (gateway.url,), ADMIN_KEY)
    try:
        events = controller.step()
        assert [e["action"] for e in events] == ["rolled"] * 3, events
        yield gateway, controller
    finally:
        controller.close()
        gateway.stop()
