"""Test tiers. A test is marked `services` when it needs Ray, Flink, vLLM, a server (PostgreSQL,
Redis, a gateway), a Dagster or `mlplane` subprocess, or the end-to-end pipeline run; everything
else is the fast tier, `scripts/test -m "not services"`, for a new engineer's edit-test loop.
CI runs both tiers.

Marking follows the fixtures a test uses, so a new test that uses one of these is in the right
tier without a hand-written mark; a new fixture that starts an engine or a server belongs here,
and a test that starts one itself carries `@pytest.mark.services`."""

from __future__ import annotations

import pytest

SERVICE_FIXTURES = frozenset(
    {
        "pipeline_dir",  # the daily pipeline end to end (Feast, great-expectations) over three days
        "ray_compute",
        "trained",  # Ray, Ray Train
        "lake",  # tests/assets/test_embeddings.py: CLIP trained on Ray, Ray Data, Qdrant
        "ray_cluster",  # tests/engines/test_ray_cluster.py: a two-node Ray cluster (tests/ray_cluster.py)
        "geometry_ray",  # tests/engines/test_geometry_ray.py: the geometry job on Ray Data
        "streaming_run",
        "first_run",
        "lake_dir",
        "stream_days",
        "flink_cluster",
        "cluster_run",
        "live_run",  # Flink
        "gateway_llm_lake",
        "gateway_llm_path",
        "gateway_llm_draft_path",  # LLMs trained by their assets
        "llm_registry",
        "llm_deployments",  # the rollout controller and its vLLM servers
        "vllm_backends",
        "v2_backend",
        "gateway",
        "prod_gateways",
        "prod_state",  # vLLM, gateway
        "registry_db",
        "postgres_registry",
        "prod_home",
        "redis_store",  # PostgreSQL, Redis
        "chromium",  # a browser
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)
