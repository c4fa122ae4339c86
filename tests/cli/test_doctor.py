"""`mlplane doctor --connect` and `--gateway-config`: beyond the settings' form, a service that takes no
connection and a gateway config that would not start are named before anything runs."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from cli.main import main
from orchestration.profiles import PROJECT_ROOT
from orchestration.settings import SETTINGS, unreachable
from tests.services import POSTGRES, REDIS

PROD_GATEWAY = str(PROJECT_ROOT / "deploy" / "prod" / "gateway.yaml")


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def no_settings(monkeypatch):
    for name in [s.name for s in SETTINGS]:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.services
def test_connect_names_only_the_services_that_take_no_connection():
    port = closed_port()
    env = {
        "MLPLANE_REDIS_URL": REDIS,  # the real Redis and PostgreSQL answer
        "MLPLANE_FEAST_REGISTRY_URL": f"{POSTGRES.replace('postgresql://', 'postgresql+psycopg2://')}/test",
        "MLPLANE_FLINK_REST_URL": f"http://127.0.0.1:{port}",
        "MLPLANE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port},other:9092",
        "MLPLANE_MLFLOW_ARTIFACT_ROOT": "s3://models/mlplane",  # no host to reach: not checked
        "MLPLANE_STREAMING_SLIDE_SECONDS": "60",  # not a service
    }
    assert unreachable(env, "prod") == [
        f"MLPLANE_FLINK_REST_URL: cannot reach 127.0.0.1:{port} (Connection refused)",
        f"MLPLANE_KAFKA_BOOTSTRAP_SERVERS: cannot reach 127.0.0.1:{port} (Connection refused)",
    ]


def test_doctor_connect_fails_naming_the_unreachable_setting(no_settings, monkeypatch):
    port = closed_port()
    monkeypatch.setenv("MLPLANE_GATEWAY_URL", f"http://127.0.0.1:{port}")
    assert CliRunner().invoke(main, ["doctor"]).exit_code == 0  # the form is right
    result = CliRunner().invoke(main, ["doctor", "--connect"])
    assert result.exit_code == 1
    assert f"MLPLANE_GATEWAY_URL: cannot reach 127.0.0.1:{port}" in result.output


def test_doctor_connect_passes_when_every_named_service_answers(no_settings, monkeypatch):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        monkeypatch.setenv("MLPLANE_GATEWAY_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
        result = CliRunner().invoke(main, ["doctor", "--connect"])
    assert result.exit_code == 0, result.output
    assert "settings are complete and reachable" in result.output


def test_the_shipped_gateway_config_names_the_variables_it_needs(no_settings):
    result = CliRunner().invoke(main, ["doctor", "--gateway-config", PROD_GATEWAY])
    assert result.exit_code == 1
    assert "set MLPLANE_GATEWAY_DB_URL, MLPLANE_GATEWAY_REDIS_URL, MLPLANE_GATEWAY_TOKENIZER" in result.output


def test_a_gateway_tokenizer_that_does_not_exist_is_named(no_settings, monkeypatch, tmp_path):
    monkeypatch.setenv("MLPLANE_GATEWAY_DB_URL", "postgresql://gateway@db:5432/gateway")
    monkeypatch.setenv("MLPLANE_GATEWAY_REDIS_URL", "redis://redis:6379/0")
    monkeypatch.setenv("MLPLANE_GATEWAY_TOKENIZER", str(tmp_path / "missing"))
    result = CliRunner().invoke(main, ["doctor", "--gateway-config", PROD_GATEWAY])
    assert result.exit_code == 1
    assert f"the tokenizer '{tmp_path / 'missing'}' of gateway-llm (eu-west) does not exist" in result.output
    (tmp_path / "missing").mkdir()
    result = CliRunner().invoke(main, ["doctor", "--gateway-config", PROD_GATEWAY])
    assert result.exit_code == 0, result.output
