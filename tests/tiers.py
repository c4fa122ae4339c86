"""Test tiers. A test is marked `services` when it needs Ray, Flink, vLLM, a server (PostgreSQL,
Redis, a gateway), a Dagster or `mlplane` subprocess, or the end-to-end pipeline run; everything
else is the fast tier, `scripts/test -m "not services"`, for a new engineer's edit-test loop.
CI runs both tiers.

Marking follows the fixtures a test uses, so a new test that uses one of these is in the right
tier without a hand-written mark; a new fixture that starts an engine or a server belongs here,
and a test that starts one itself carries `@pytest.mark.services`.

CI runs the suite on two workers (`-n 2 --dist loadgroup`, .ci/run). Each test module is one group, so
its module fixtures start once; packages whose fixtures outlive a module (the Flink cluster and live job
of tests/streaming, the vLLM backends and gateways of tests/serving/gateway and tests/serving/llm, which
share one trained LLM) are one group each, and so are the modules that use one session-scoped served
model (SHARED_FIXTURES), which a worker would otherwise set up again. What both workers read (the
pipeline's lake, the personalization model trained on it, the gateway LLM that tests/serving and the vision
captioner's test use) is built once per run: tests/conftest.py's `built_once`."""

from __future__ import annotations

from pathlib import Path

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = module_groups(items)
    for item in items:
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)
        item.add_marker(pytest.mark.xdist_group(groups[item.path]))
        if getattr(config.option, "loadgroup", False):  # an xdist worker of `--dist loadgroup`
            join_group(item, groups[item.path])
    # the longest groups first, so that two workers end together (a stable sort keeps modules whole)
    items.sort(key=lambda item: LONGEST_FIRST.get(groups[item.path], len(LONGEST_FIRST)))


SHARED_FIXTURES = {  # session-scoped engines over a trained model: the files using one share a worker
    "served_lake": "tests/serving/models:served_lake",  # the pipeline's lake, a trained model and CLIP
    "trained": "tests/models:trained",  # a personalization model trained on Ray
}


def join_group(item: pytest.Item, group: str) -> None:
    """The test id with its group as `--dist loadgroup` schedules by (`<id>@<group>`). pytest-xdist 3.8
    writes it to `item._nodeid`, which pytest 9 no longer reads (the id is `item._id`): without this every
    test went to whichever worker was free, and each worker started every engine."""
    from _pytest.nodeid import NodeId

    if "@" not in item.nodeid:
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def module_groups(items: list[pytest.Item]) -> dict[Path, str]:
    """Each test file's xdist group: that of a shared engine (SHARED_FIXTURES) one of its tests uses,
    else its package's (SHARED_PACKAGES), else its own path. A session fixture is built once per worker
    that uses it, so the files that use one must not be split between workers."""
    groups = {item.path: worker_group(item.path) for item in items}
    for item in items:
        for fixture, group in SHARED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                groups[item.path] = group
                break
    return groups


SHARED_PACKAGES = {  # test folders whose package- or session-scoped engines one worker should start once
    "streaming": "tests/streaming",
    "serving/gateway": "tests/serving/llm",
    "serving/llm": "tests/serving/llm",
}
LONGEST_FIRST = {
    group: rank
    for rank, group in enumerate(
        [
            "tests/test_readme.py",
            "tests/streaming",
            "tests/serving/llm",
            "tests/assets/test_embeddings.py",
            "tests/engines/test_ray_cluster.py",
        ]
    )
}


def worker_group(path: Path) -> str:
    """The xdist group of a test file: its package's where the package shares engines, else its own path."""
    parts = path.parts
    relative = "/".join(parts[len(parts) - 1 - parts[::-1].index("tests") + 1 :])
    for folder, group in SHARED_PACKAGES.items():
        if relative.startswith(folder + "/"):
            return group
    return f"tests/{relative}"
