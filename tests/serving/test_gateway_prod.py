"""The prod profile's gateway state: keys and usage in the real PostgreSQL, rate-limit counters in the
real Redis (shared by two gateway replicas), and no usage record lost on a clean shutdown."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import uuid

import openai
import pytest
from click.testing import CliRunner

from orchestration.cli import main as mlplane
from serving.gateway.store import GatewayStore, hash_key
from tests.services import REDIS, create_database, drop_database, redis_client
from tests.serving.conftest import MODEL_NAME, GatewayProcess, gateway_config
from tests.serving.test_gateway import MESSAGES, assert_tokens_per_minute_hold, client


@pytest.fixture(scope="module")
def prod_state():
    name = f"mlplane_gateway_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    prefix = f"mlplane:test:{uuid.uuid4().hex[:8]}"
    yield url, f"redis://{REDIS}/0", prefix
    drop_database(name)
    redis = redis_client()
    for key in redis.scan_iter(f"{prefix}:*"):
        redis.delete(key)


@pytest.fixture(scope="module")
def prod_gateways(vllm_backends, gateway_llm_path, prod_state, tmp_path_factory):
    """Two replicas sharing one PostgreSQL store and one Redis."""
    store, redis_url, prefix = prod_state
    config = gateway_config(vllm_backends, gateway_llm_path, store, redis_url, prefix)
    replicas = [GatewayProcess(config, tmp_path_factory.mktemp(f"replica{i}")) for i in range(2)]
    yield replicas
    for replica in replicas:
        replica.stop()


def test_keys_cli_on_postgres_stores_only_hashes(prod_gateways, prod_state):
    store_url = prod_state[0]
    runner = CliRunner()
    created = runner.invoke(mlplane, ["gateway", "keys", "create", "--store", store_url, "--owner", "etl",
                                      "--team", "data", "--model", MODEL_NAME, "--tpm", "5000", "--rpm", "100",
                                      "--expires-in-days", "30"])
    assert created.exit_code == 0, created.output
    record = json.loads(created.output)
    secret = record["key"]
    assert record["models"] == [MODEL_NAME] and record["tpm"] == 5000

    import sqlalchemy as sa

    with GatewayStore(store_url).engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT * FROM gateway_keys WHERE key_id = :k"),
                              {"k": record["key_id"]}).mappings().one()
    assert stored["key_hash"] == hash_key(secret) and secret not in json.dumps(dict(stored), default=str)

    for replica in prod_gateways:  # both replicas read the same store
        answer = client(replica, secret).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
        assert answer.model == MODEL_NAME

    listed = runner.invoke(mlplane, ["gateway", "keys", "list", "--store", store_url])
    assert record["key_id"] in listed.output and "[active]" in listed.output and secret not in listed.output
    rotated = runner.invoke(mlplane, ["gateway", "keys", "rotate", record["key_id"], "--store", store_url])
    new_secret = json.loads(rotated.output)["key"]
    with pytest.raises(openai.AuthenticationError):
        client(prod_gateways[0], secret).models.list()
    assert client(prod_gateways[1], new_secret).models.list().data
    revoked = runner.invoke(mlplane, ["gateway", "keys", "revoke", record["key_id"], "--store", store_url])
    assert revoked.exit_code == 0
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        client(prod_gateways[1], new_secret).models.list()
    missing = runner.invoke(mlplane, ["gateway", "keys", "revoke", "nosuchkey", "--store", store_url])
    assert missing.exit_code != 0 and "no API key with id 'nosuchkey'" in missing.output


def test_request_limit_is_shared_by_replicas_through_redis(prod_gateways):
    key = prod_gateways[0].key(rpm=3)
    answered = []
    for replica in prod_gateways * 2:
        try:
            client(replica, key).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
            answered.append(200)
        except openai.RateLimitError as error:
            answered.append(error.status_code)
    assert answered == [200, 200, 200, 429]


def test_tokens_per_minute_under_50_concurrent_clients_in_redis(prod_gateways):
    assert_tokens_per_minute_hold(prod_gateways[0], limit=1500)


def test_usage_report_and_no_record_lost_on_clean_shutdown(vllm_backends, gateway_llm_path, prod_state,
                                                          tmp_path):
    store, redis_url, prefix = prod_state
    replica = GatewayProcess(gateway_config(vllm_backends, gateway_llm_path, store, redis_url, prefix), tmp_path)
    key = replica.key(team="shutdown-test")
    openai_client = client(replica, key)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        list(pool.map(lambda _: openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES,
                                                                       max_tokens=4), range(40)))
    # SIGTERM: uvicorn finishes open requests, the usage writer empties its queue, then uvicorn exits
    # by re-raising the signal it handled
    assert replica.stop() == -signal.SIGTERM
    assert "Traceback" not in replica.log.read_text()
    result = CliRunner().invoke(mlplane, ["usage", "--store", store, "--group-by", "team,model,status", "--json"])
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(result.output) if r["team"] == "shutdown-test"]
    assert rows == [{**rows[0], "model": MODEL_NAME, "status": 200, "requests": 40, "errors": 0}]
    assert rows[0]["completion_tokens"] <= 40 * 4 and rows[0]["prompt_tokens"] > 0
