"""The prod profile's gateway state: keys and usage in the real PostgreSQL, rate-limit counters in the
real Redis (shared by two gateway replicas), and no usage record lost on a clean shutdown."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import httpx
import openai
import pytest
import redis
import yaml
from click.testing import CliRunner

from cli.main import main as mlplane
from serving.gateway.store import GatewayStore, hash_key
from tests.services import REDIS, create_database, drop_database, redis_client
from tests.serving.conftest import (
    ADMIN_KEY,
    MODEL_NAME,
    PROJECT_ROOT,
    CuttingProxy,
    GatewayProcess,
    chat_stream,
    gateway_config,
    stop_process,
    wait_healthy,
)
from tests.serving.gateway.test_gateway import MESSAGES, assert_tokens_per_minute_hold, client


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
    created = runner.invoke(
        mlplane,
        [
            "gateway",
            "keys",
            "create",
            "--store",
            store_url,
            "--owner",
            "etl",
            "--team",
            "data",
            "--model",
            MODEL_NAME,
            "--tpm",
            "5000",
            "--rpm",
            "100",
            "--expires-in-days",
            "30",
        ],
    )
    assert created.exit_code == 0, created.output
    record = json.loads(created.output)
    secret = record["key"]
    assert record["models"] == [MODEL_NAME] and record["tpm"] == 5000

    import sqlalchemy as sa

    with GatewayStore(store_url).engine.connect() as conn:
        stored = (
            conn.execute(sa.text("SELECT * FROM gateway_keys WHERE key_id = :k"), {"k": record["key_id"]})
            .mappings()
            .one()
        )
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


def test_usage_report_and_no_record_lost_on_clean_shutdown(vllm_backends, gateway_llm_path, prod_state, tmp_path):
    store, redis_url, prefix = prod_state
    replica = GatewayProcess(gateway_config(vllm_backends, gateway_llm_path, store, redis_url, prefix), tmp_path)
    key = replica.key(team="shutdown-test")
    openai_client = client(replica, key)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        list(
            pool.map(
                lambda _: openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4),
                range(40),
            )
        )
    # SIGTERM: uvicorn finishes open requests, the usage writer empties its queue, then uvicorn exits
    # by re-raising the signal it handled
    assert replica.stop() == -signal.SIGTERM
    assert "Traceback" not in replica.log.read_text()
    result = CliRunner().invoke(mlplane, ["usage", "--store", store, "--group-by", "team,model,status", "--json"])
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(result.output) if r["team"] == "shutdown-test"]
    assert rows == [{**rows[0], "model": MODEL_NAME, "status": 200, "requests": 40, "errors": 0}]
    assert rows[0]["completion_tokens"] <= 40 * 4 and rows[0]["prompt_tokens"] > 0


def redis_counter(prefix: str, key: str) -> int:
    """The tokens the limiter holds for a key in its sliding minute, read straight from Redis."""
    return sum(int(v) for v in redis_client().hgetall(f"{prefix}:key:{key_id_of(key)}:tokens:minute").values())


def key_id_of(key: str) -> str:
    return key.split("-")[2]


def test_a_cancelled_stream_settles_its_redis_reservation_and_is_recorded(
    vllm_backends, gateway_llm_path, prod_state, tmp_path
):
    """Before: the settlement of a stream the client cancelled was itself cancelled, leaving the whole
    reservation (prompt + max_tokens) in Redis and no usage record. The chat backends sit behind a slow
    link (CuttingProxy holding back each piece), so the hang-up always comes mid-stream (the tiny model
    alone can finish 200 tokens first)."""
    store, redis_url, prefix = prod_state
    links = {region: CuttingProxy(vllm_backends[region].port, float("inf"), delay_s=0.02) for region in ("eu", "us")}
    try:
        backends = {**vllm_backends, **links}
        replica = GatewayProcess(gateway_config(backends, gateway_llm_path, store, redis_url, prefix), tmp_path)
        try:
            key = replica.key(tpm=5000)
            body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 200, "stream": True, "ignore_eos": True}
            with chat_stream(replica, key, body) as response:
                lines = response.iter_lines()
                for _ in range(3):
                    next(lines)
            rows = wait_rows(store, key, 1)
        finally:
            replica.stop()
    finally:
        for link in links.values():
            link.close()
    assert [r["status"] for r in rows] == [499]
    used = rows[0]["prompt_tokens"] + rows[0]["completion_tokens"]
    assert 0 < rows[0]["completion_tokens"] < 200
    assert redis_counter(prefix, key) == used  # settled to what was streamed, not what was reserved


def wait_rows(store: str, key: str, expected: int) -> list[dict]:
    gateway_store = GatewayStore(store)
    try:
        for _ in range(150):
            rows = [
                r for r in gateway_store.usage_report(0, None, ("key_id", "status")) if r["key_id"] == key_id_of(key)
            ]
            if sum(r["requests"] for r in rows) >= expected:
                return rows
            time.sleep(0.2)
    finally:
        gateway_store.close()
    raise AssertionError(f"{expected} usage records for {key_id_of(key)} never arrived: {rows}")


class SilentServer:
    """Accepts connections and never answers: a Redis that hangs (a fake for a network fault, outside
    the platform)."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.held.append(connection)

    def close(self) -> None:
        self.socket.close()
        for connection in self.held:
            connection.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


def test_redis_down_or_hanging_is_a_503_in_openai_shape_and_recorded(
    vllm_backends, gateway_llm_path, prod_state, tmp_path
):
    """A refused connection and a silent server both give a 503 with an OpenAI error body within the
    client's 30 s timeout (settings.redis_timeout_s bounds each call), and a usage record; with
    `rate_limit_failure: open` the request is served unmetered instead."""
    store, _, prefix = prod_state
    silent = SilentServer()
    try:
        for name, url, failure, expected in (
            ("down", f"redis://127.0.0.1:{closed_port()}/0", "closed", 503),
            ("hanging", f"redis://127.0.0.1:{silent.port}/0", "closed", 503),
            ("open", f"redis://127.0.0.1:{silent.port}/0", "open", 200),
        ):
            workdir = tmp_path / name
            workdir.mkdir()
            config = gateway_config(vllm_backends, gateway_llm_path, store, url, prefix)
            config["settings"].update(rate_limit_failure=failure, redis_timeout_s=0.3)
            replica = GatewayProcess(config, workdir)
            try:
                key = replica.key(tpm=1000)
                answer = httpx.post(
                    f"{replica.url}/v1/chat/completions",
                    timeout=30,
                    json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 2},
                    headers={"Authorization": f"Bearer {key}"},
                )
                assert answer.status_code == expected, answer.text
                if expected == 503:
                    assert answer.json()["error"]["code"] == "rate_limiter_unavailable"
                    assert answer.headers["retry-after"]
                assert [r["status"] for r in wait_rows(store, key, 1)] == [expected]
            finally:
                replica.stop()
    finally:
        silent.close()


def test_redis_outage_while_a_request_is_at_the_backend_loses_nothing(
    vllm_backends, gateway_llm_path, prod_state, tmp_path
):
    """A real Redis killed while a stream is running: the stream finishes, its usage record is written
    (before: a plain-text 500 and no record); the next request is a clean 503."""
    store, _, prefix = prod_state
    port = closed_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(100):
            try:
                if redis.Redis(port=port).ping():
                    break
            except redis.ConnectionError:
                time.sleep(0.1)
        config = gateway_config(vllm_backends, gateway_llm_path, store, f"redis://127.0.0.1:{port}/0", prefix)
        replica = GatewayProcess(config, tmp_path)
        try:
            key = replica.key(tpm=5000)
            body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 60, "stream": True, "ignore_eos": True}
            with chat_stream(replica, key, body) as response:
                lines = response.iter_lines()
                next(lines)
                stop_process(server)
                rest = list(lines)
            assert response.status_code == 200 and "data: [DONE]" in rest
            rows = wait_rows(store, key, 1)
            assert [r["status"] for r in rows] == [200] and rows[0]["completion_tokens"] == 60
            after = httpx.post(
                f"{replica.url}/v1/chat/completions",
                timeout=30,
                json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 2},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert after.status_code == 503 and after.json()["error"]["type"] == "service_unavailable"
        finally:
            replica.stop()
    finally:
        stop_process(server)


def test_key_store_down_is_a_503_in_openai_shape(vllm_backends, gateway_llm_path, tmp_path):
    name = f"mlplane_gateway_down_{uuid.uuid4().hex[:8]}"
    store = create_database(name)
    replica = GatewayProcess(gateway_config(vllm_backends, gateway_llm_path, store), tmp_path)
    try:
        key = replica.key()
        drop_database(name)  # terminates the gateway's connections
        answer = httpx.get(f"{replica.url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "key_store_unavailable"
        assert "postgres" not in answer.text.lower()
    finally:
        replica.stop()
        drop_database(name)


def test_workers_share_their_limits_through_redis(vllm_backends, gateway_llm_path, prod_state, tmp_path):
    """`--workers 2` (`python -m serving.gateway` is `mlplane gateway serve` without the platform's CLI
    imports): a key's request limit holds across both processes."""
    store, redis_url, prefix = prod_state
    config = gateway_config(vllm_backends, gateway_llm_path, store, redis_url, prefix)
    config_path = tmp_path / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    port = closed_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.gateway",
            "--config",
            str(config_path),
            "--port",
            str(port),
            "--workers",
            "2",
            "--log-level",
            "warning",
        ],
        env={**os.environ, "MLPLANE_GATEWAY_ADMIN_KEY": ADMIN_KEY},
        cwd=PROJECT_ROOT,
        stdout=(tmp_path / "workers.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", process, tmp_path / "workers.log", timeout=120)
        key = httpx.post(
            f"http://127.0.0.1:{port}/admin/keys",
            json={"owner": "w", "team": "w", "rpm": 4},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        ).json()["key"]
        statuses = []
        for _ in range(8):  # a fresh connection each time: the kernel spreads them over the workers
            statuses.append(
                httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    timeout=60,
                    json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 2},
                    headers={"Authorization": f"Bearer {key}", "Connection": "close"},
                ).status_code
            )
        assert statuses == [200] * 4 + [429] * 4
    finally:
        stop_process(process)
