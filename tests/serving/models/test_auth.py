"""Who may call the model server: control calls (repository load and unload) only with the admin key,
and never when none is set; data-plane calls with the data key where one is set; probes, metrics and
the OpenAPI document always. Every refusal is a 401 or 403 whose `error` names the problem."""

from __future__ import annotations

import json
import stat

import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from cli.main import main as mlplane
from serving.models.auth import ADMIN, DATA, OPEN, Keys, grpc_role, rest_role
from serving.models.config import ServerConfig
from serving.models.protocols.app import create_app
from tests.serving.models.conftest import ADMIN_KEY, TOWER_ENTRIES, keyed_server
from tests.serving.test_api_docs import assert_docs_offline

CONTROL = ("/v2/repository/models/personalization-challenger/unload", "/v2/repository/models/personalization/load")


def test_control_calls_need_the_admin_key(tower_server):
    for path in CONTROL:
        anonymous = httpx.post(tower_server.url + path)
        assert anonymous.status_code == 401 and "Bearer" in anonymous.json()["error"], anonymous.text
        assert anonymous.headers["www-authenticate"] == "Bearer"
        for authorization in ("Bearer a-guess", f"Bearer {ADMIN_KEY}x", f"Basic {ADMIN_KEY}", "Bearer"):
            refused = httpx.post(tower_server.url + path, headers={"Authorization": authorization})
            assert refused.status_code in (401, 403) and refused.json()["error"], (authorization, refused.text)
    assert httpx.get(f"{tower_server.url}/v2/models/personalization-challenger/ready").status_code == 200


@pytest.fixture
def client_with(tower_registry, tmp_path):
    """A client of a server (not started: nothing loaded) holding the given keys."""
    _, root = tower_registry
    servers = []

    def make(admin_key: str | None = None, data_key: str | None = None, max_body_bytes=2**20, **client) -> TestClient:
        config = ServerConfig(
            max_body_bytes=max_body_bytes,
            registry_root=str(root / "registry"),
            lake_root=str(tmp_path / f"lake{len(servers)}"),
            models=TOWER_ENTRIES,
            feature_log_sample=0.0,
        )
        servers.append(keyed_server(config, admin_key, data_key))
        return TestClient(create_app(servers[-1], start=False), **client)

    yield make
    for server in servers:
        server.close()


def test_without_an_admin_key_control_calls_are_refused_naming_the_setting(client_with):
    client = client_with(admin_key=None)
    for path in CONTROL:
        for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Bearer anything"}):
            refused = client.post(path, headers=headers)
            assert refused.status_code == 403, refused.text
            assert "MLPLANE_MODEL_SERVER_ADMIN_KEY" in refused.json()["error"]


def test_a_root_path_does_not_hide_a_control_call(client_with):
    client = client_with(admin_key=ADMIN_KEY, root_path="/api")
    assert client.post("/api" + CONTROL[0]).status_code == 401
    assert rest_role("/api" + CONTROL[0]) == ADMIN


def test_the_docs_page_works_offline_and_a_data_key_does_not_hide_it(client_with):
    assert_docs_offline(client_with(admin_key="the-admin", data_key="the-data"))


def test_a_data_key_guards_the_data_plane_but_not_the_probes(client_with):
    client = client_with(admin_key="the-admin", data_key="the-data")
    for path in ("/v2/health/live", "/metrics", "/openapi.json"):
        assert client.get(path).status_code == 200, path
    calls = [
        ("POST", "/v2/models/personalization/infer", {"inputs": []}),  # the direct infer path
        ("POST", "/v2/models/personalization/versions/1/infer", {"inputs": []}),
        ("POST", "/recommend", {"user_id": 1}),
        ("GET", "/v2/models/personalization", None),
        ("POST", "/v2/repository/index", {}),
    ]
    for method, path, body in calls:
        assert client.request(method, path, json=body).status_code == 401, path
        assert client.request(method, path, json=body, headers={"Authorization": "Bearer no"}).status_code == 403
        for key in ("the-data", "the-admin"):
            answer = client.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"})
            assert answer.status_code not in (401, 403), (path, key, answer.text)
    refused = client.post(CONTROL[0], headers={"Authorization": "Bearer the-data"})
    assert refused.status_code == 403 and "control" in refused.json()["error"]


def test_roles_of_grpc_methods():
    assert grpc_role("/inference.GRPCInferenceService/RepositoryModelUnload") == ADMIN
    assert grpc_role("/inference.GRPCInferenceService/RepositoryModelLoad") == ADMIN
    assert grpc_role("/inference.GRPCInferenceService/ModelInfer") == DATA
    assert grpc_role("/inference.GRPCInferenceService/ServerLive") == OPEN
    Keys(admin=b"k").check(ADMIN, "bearer k")  # the scheme is case-insensitive


def test_a_body_over_the_limit_is_refused_before_it_is_read(client_with):
    client = client_with(max_body_bytes=1000)
    big = b"x" * 5000
    for path in ("/v2/models/nope/infer", "/recommend", "/get-online-features"):
        declared = client.post(path, content=big)
        assert declared.status_code == 413 and "max_body_bytes" in declared.json()["error"], (path, declared.text)
    # no declared length; a model that exists (an unknown one is refused before its body is read)
    chunked = client.post("/v2/models/recommend/infer", content=iter([big[:800], big[800:]]))
    assert chunked.status_code == 413, chunked.text
    assert client.post("/v2/models/nope/infer", json={"inputs": []}).status_code == 404  # under the limit


def cli(*arguments: str) -> str:
    result = CliRunner().invoke(mlplane, ["models", "keys", *arguments])
    assert result.exit_code == 0, result.output
    return result.output


def test_keys_made_with_the_cli_guard_a_running_server_and_rotate_without_a_restart(client_with, tmp_path):
    lake = str(tmp_path / "lake0")  # the first client's lake: its server reads <lake>/serving's key file
    admin = json.loads(cli("create", "ops", "--role", "admin", "--data-dir", lake))["key"]
    client = client_with(admin_key=None)  # no environment key: only the file's
    unknown = "/v2/repository/models/no-such-model/unload"  # a control call that passes the check, then 404s

    def status(path: str, key: str | None, method: str = "POST") -> int:
        return client.request(method, path, headers={"Authorization": f"Bearer {key}"} if key else {}).status_code

    assert (status(unknown, None), status(unknown, admin + "x"), status(unknown, admin)) == (401, 403, 404)
    assert status("/v2/models/personalization", None, "GET") != 401  # no data key yet: the data plane is open

    rotated = cli("rotate", "ops", "--secret-only", "--data-dir", lake).strip()
    assert (status(unknown, admin), status(unknown, rotated)) == (403, 404)  # from the next request

    data = cli("create", "reader", "--role", "data", "--secret-only", "--data-dir", lake).strip()
    assert status("/v2/models/personalization", None, "GET") == 401  # a data key now guards the data plane
    for key in (data, rotated):
        assert status("/v2/models/personalization", key, "GET") not in (401, 403)
    assert status(unknown, data) == 403  # a data key makes no control call

    assert "revoked reader (data)" in cli("revoke", "reader", "--data-dir", lake)
    assert status("/v2/models/personalization", None, "GET") != 401  # no active data key: open again
    cli("revoke", "ops", "--data-dir", lake)
    refused = client.post(unknown, headers={"Authorization": f"Bearer {rotated}"})
    assert refused.status_code == 403 and "mlplane models keys create" in refused.json()["error"]

    listed = cli("list", "--data-dir", lake)
    assert "ops" in listed and "reader" in listed and listed.count("[revoked]") == 2
    key_file = tmp_path / "lake0" / "serving" / "model_server_keys.json"
    stored = key_file.read_text()
    assert not any(secret in stored for secret in (admin, rotated, data))  # digests only
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    duplicate = CliRunner().invoke(mlplane, ["models", "keys", "create", "ops", "--role", "data", "--data-dir", lake])
    assert duplicate.exit_code != 0 and "exists" in duplicate.output
