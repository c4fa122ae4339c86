"""deploy/prod/gateway.yaml takes its database, Redis and tokenizer from the environment (`${NAME}` in the
gateway's YAML), so the shipped file starts anywhere and names what is missing."""

from __future__ import annotations

import pytest

from orchestration.profiles import PROJECT_ROOT
from serving.gateway.config import ConfigError, load_config, parse_config

PROD_GATEWAY = PROJECT_ROOT / "deploy" / "prod" / "gateway.yaml"
ENV = {
    "MLPLANE_GATEWAY_DB_URL": "postgresql://gateway@pg.example:5432/gateway",
    "MLPLANE_GATEWAY_REDIS_URL": "redis://redis.example:6379/0",
    "MLPLANE_GATEWAY_TOKENIZER": "/mnt/models/gateway_llm",
}


def test_the_prod_gateway_config_is_built_from_the_environment(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    config = load_config(PROD_GATEWAY)
    assert config.settings.store == ENV["MLPLANE_GATEWAY_DB_URL"]
    assert config.settings.rate_limits == ENV["MLPLANE_GATEWAY_REDIS_URL"]
    assert {e.tokenizer for e in config.model_list if e.tokenizer} == {ENV["MLPLANE_GATEWAY_TOKENIZER"]}
    assert "db.internal" not in PROD_GATEWAY.read_text()


def test_an_unset_variable_is_named(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLPLANE_GATEWAY_TOKENIZER")
    monkeypatch.delenv("MLPLANE_GATEWAY_DB_URL")
    with pytest.raises(ConfigError, match="set MLPLANE_GATEWAY_DB_URL, MLPLANE_GATEWAY_TOKENIZER"):
        load_config(PROD_GATEWAY)


def test_a_default_is_used_when_the_variable_is_unset(monkeypatch):
    monkeypatch.delenv("MLPLANE_UNSET_FOR_TEST", raising=False)
    raw = {
        "model_list": [{"model_name": "m", "url": "http://10.0.0.5:8000"}],
        "settings": {"store": "${MLPLANE_UNSET_FOR_TEST:-sqlite:///g.db}", "rate_limits": "memory"},
    }
    assert parse_config(raw).settings.store == "sqlite:///g.db"
