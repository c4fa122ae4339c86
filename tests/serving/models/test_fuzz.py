"""Schema-driven fuzzing over the server's own OpenAPI document (schemathesis + hypothesis): whatever
a client sends, the answer is never a server error; a refusal is a 4xx with an `error` naming it, and
a 503 only for a dependency that is missing (this server has no item catalogue or feature store) and
says so. Then schemathesis' own runner with every check (`--checks all`: statuses, content types,
headers and bodies as documented, schema-valid requests accepted, invalid ones refused, methods,
authentication) finds no failure; the statuses allowed by design are listed in schemathesis.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from serving.models.config import ServerConfig
from tests.serving.models.conftest import ADMIN_KEY, TOWER_ENTRIES, start_server

DEPENDENCY_PATHS = ("/recommend", "/get-online-features", "/v2/models/recommend")
FUZZ_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
)


@pytest.fixture(scope="module")
def fuzz_server(tower_registry, tmp_path_factory):
    _, root = tower_registry
    config = ServerConfig(
        registry_root=str(root / "registry"),
        lake_root=str(tmp_path_factory.mktemp("fuzz_lake")),
        models=TOWER_ENTRIES,
        poll_interval_s=0.5,
        feature_log_sample=0.0,
    )
    running = start_server(config)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def server_schema(fuzz_server):
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")


def check(case, calls: list) -> None:
    response = case.call(timeout=30)
    calls.append(response.status_code)
    status = response.status_code
    assert status < 500 or (status == 503 and case.path.startswith(DEPENDENCY_PATHS)), (
        case.method,
        case.path,
        case.body,
        status,
        response.text[:300],
    )
    if status >= 400 and case.path != "/v2/health/ready":
        assert response.json().get("error"), (case.path, status, response.text[:300])


@pytest.mark.services  # a server, fuzzed over its OpenAPI document
def test_no_request_gets_a_server_error(server_schema):
    # each operation's strategy driven by hypothesis directly (schemathesis' lazy pytest fixture
    # does not run under pytest 9)
    operations = [result.ok() for result in server_schema.get_all_operations()]
    assert len(operations) >= 15
    calls: list[int] = []
    for operation in operations:
        FUZZ_SETTINGS(given(case=operation.as_strategy())(lambda case: check(case, calls)))()
    assert len(calls) > 5 * len(operations) and any(400 <= c < 500 for c in calls)


@pytest.mark.services  # a server, run through schemathesis' CLI with every check
def test_every_schemathesis_check_passes(fuzz_server, tmp_path):
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "--config-file",
        str(Path(__file__).parent / "schemathesis.toml"),
        "run",
        f"{fuzz_server.url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "40",
        "--seed",
        "42",
        "--no-color",
        "--header",
        f"Authorization: Bearer {ADMIN_KEY}",  # the control operations too
    ]
    # its example database (.schemathesis/) goes to the working folder: not the checkout
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-6000:] + run.stderr[-2000:]
