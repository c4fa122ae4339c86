"""The gateway with the official OpenAI client in front of real vLLM backends in two regions
(SQLite keys and usage, in-process rate limits)."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import openai
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from cli.main import main as mlplane
from resources.gateway import GatewayResource
from tests.serving.conftest import EMBEDDING_MODEL, MODEL_NAME, CuttingProxy, GatewayProcess, gateway_config

MESSAGES = [{"role": "user", "content": "Is the red wooden chair still for sale?"}]


def client(gateway, key: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120, **kwargs)


def usage_rows(gateway, request_ids_expected: int, **params) -> list[dict]:
    """Usage rows once the writer has stored at least the expected number of requests (written off the
    request path, so they land shortly after the responses)."""
    for _ in range(100):
        rows = gateway.admin("GET", "/admin/usage", params=params).json()["data"]
        if sum(r["requests"] for r in rows) >= request_ids_expected:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"usage rows never reached {request_ids_expected}: {rows}")


def test_chat_completion_and_usage_record(gateway):
    key = gateway.key(models=[MODEL_NAME])
    response = client(gateway, key).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8)
    assert response.model == MODEL_NAME
    assert isinstance(response.choices[0].message.content, str)
    assert response.usage.prompt_tokens > 0 and 0 < response.usage.completion_tokens <= 8
    key_id = key.split("-")[2]
    rows = usage_rows(gateway, 1, group_by="key_id,model,endpoint,status")
    mine = [r for r in rows if r["key_id"] == key_id]
    assert mine == [
        {
            **mine[0],
            "model": MODEL_NAME,
            "endpoint": "chat",
            "status": 200,
            "requests": 1,
            "prompt_tokens": response.usage.prompt_tokens,
            "completion_tokens": response.usage.completion_tokens,
        }
    ]


def test_prompt_tokens_counted_before_the_call_match_the_backend(gateway):
    """The gateway's own count (the model's tokenizer plus the chat template's overhead) is what vLLM
    reports, so token reservations are exact for this model."""
    from serving.gateway.tokens import TokenCounter

    key = gateway.key()
    response = client(gateway, key).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    counter = TokenCounter(gateway.config["model_list"][0]["tokenizer"])
    assert counter.prompt_tokens("chat", {"messages": MESSAGES}) == response.usage.prompt_tokens


def test_streaming_chat(gateway):
    key = gateway.key()
    openai_client = client(gateway, key)
    chunks = list(openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, stream=True))
    assert chunks and all(c.model == MODEL_NAME for c in chunks)
    assert all(c.choices for c in chunks)  # the usage chunk the gateway asked for is not passed on
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    with_usage = list(
        openai_client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    assert with_usage[-1].usage is not None and 0 < with_usage[-1].usage.completion_tokens <= 8


def test_text_completion(gateway):
    key = gateway.key()
    response = client(gateway, key).completions.create(model=MODEL_NAME, prompt="Blue metal lamp", max_tokens=6)
    assert response.model == MODEL_NAME and 0 < response.usage.completion_tokens <= 6


def test_embeddings(gateway, vllm_backends):
    key = gateway.key()
    response = client(gateway, key).embeddings.create(
        model=EMBEDDING_MODEL, input=["red wooden chair", "green glass lamp"]
    )
    assert len(response.data) == 2
    vectors = [d.embedding for d in response.data]
    assert len(vectors[0]) == len(vectors[1]) == 128  # the model's hidden size
    assert vectors[0] != vectors[1]
    assert response.usage.prompt_tokens > 0


def test_models_lists_what_the_key_may_use(gateway):
    everything = {m.id for m in client(gateway, gateway.key()).models.list()}
    assert everything == {MODEL_NAME, EMBEDDING_MODEL}
    only_chat = {m.id for m in client(gateway, gateway.key(models=[MODEL_NAME])).models.list()}
    assert only_chat == {MODEL_NAME}


def test_model_outside_the_entitlements_is_403(gateway):
    key = gateway.key(models=[EMBEDDING_MODEL])
    with pytest.raises(openai.PermissionDeniedError) as error:
        client(gateway, key).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    assert error.value.status_code == 403
    assert error.value.body["code"] == "model_not_allowed" and MODEL_NAME in error.value.body["message"]


def test_revoked_expired_rotated_and_unknown_keys_are_401(gateway):
    key = gateway.key()
    key_id = key.split("-")[2]
    openai_client = client(gateway, key)
    openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    result = CliRunner().invoke(mlplane, ["gateway", "keys", "revoke", key_id, "--config", str(gateway.config_path)])
    assert result.exit_code == 0, result.output
    with pytest.raises(openai.AuthenticationError) as error:
        openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    assert "revoked" in error.value.body["message"] and error.value.body["code"] == "invalid_api_key"

    expired = gateway.key(expires_at=time.time() - 1)
    with pytest.raises(openai.AuthenticationError) as error:
        client(gateway, expired).models.list()
    assert "expired" in error.value.body["message"]

    old = gateway.key()
    rotated = gateway.admin("POST", f"/admin/keys/{old.split('-')[2]}/rotate").json()["key"]
    with pytest.raises(openai.AuthenticationError):
        client(gateway, old).models.list()
    assert {m.id for m in client(gateway, rotated).models.list()} == {MODEL_NAME, EMBEDDING_MODEL}
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "sk-mlp-000000000000-nonsense").models.list()


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "code"}, body
    return body["error"]


def test_bad_requests_get_clear_4xx_never_5xx(gateway):
    key = gateway.key()
    auth = {"Authorization": f"Bearer {key}"}
    url = f"{gateway.url}/v1/chat/completions"

    malformed = httpx.post(url, content=b'{"model": "gateway-llm", "messages": [', headers=auth, timeout=30)
    assert malformed.status_code == 400 and "not valid JSON" in error_of(malformed)["message"]

    not_object = httpx.post(url, json=[1, 2], headers=auth, timeout=30)
    assert not_object.status_code == 400 and "JSON object" in error_of(not_object)["message"]

    big = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x" * 70_000}]}
    oversized = httpx.post(url, json=big, headers=auth, timeout=30)
    assert oversized.status_code == 413 and "65536 bytes" in error_of(oversized)["message"]

    with pytest.raises(openai.NotFoundError) as unknown:
        client(gateway, key).chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert unknown.value.body["code"] == "model_not_found" and "no-such-model" in unknown.value.body["message"]

    missing = httpx.post(url, json={"model": MODEL_NAME}, headers=auth, timeout=30)
    assert missing.status_code == 400 and error_of(missing)["param"] == "messages"

    bad_cap = httpx.post(
        url, json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": -3}, headers=auth, timeout=30
    )
    assert bad_cap.status_code == 400 and "max_tokens" in error_of(bad_cap)["message"]

    no_key = httpx.post(url, json={"model": MODEL_NAME, "messages": MESSAGES}, timeout=30)
    assert no_key.status_code == 401 and "Missing API key" in error_of(no_key)["message"]

    # a request the backend itself refuses (over its context length) is the backend's 4xx, passed on
    too_long = client(gateway, key).chat.completions
    with pytest.raises(openai.BadRequestError):
        too_long.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=10_000)


def backend_metrics(gateway) -> tuple[float, float]:
    """(upstream attempts booked as failures, circuits open) of the chat model's backends, from /metrics."""
    failures = circuits = 0.0
    for family in text_string_to_metric_families(gateway.metrics()):
        for sample in family.samples:
            if sample.name == "mlplane_gateway_backend_requests_total" and sample.labels["outcome"] == "failure":
                failures += sample.value
            if sample.name == "mlplane_gateway_backend_circuit_open" and sample.labels["model"] == MODEL_NAME:
                circuits += sample.value
    return failures, circuits


def test_client_errors_the_backend_answers_never_open_its_circuit(gateway):
    """A 4xx from the backend is the client's mistake: more of them than the circuit breaker's threshold
    (3) leave every backend in rotation and book no failed attempt."""
    key = gateway.key()
    failures_before, _ = backend_metrics(gateway)
    for _ in range(8):
        with pytest.raises(openai.BadRequestError):
            client(gateway, key).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=10_000)
    assert backend_metrics(gateway) == (failures_before, 0)
    answer = client(gateway, key).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    assert answer.choices[0].message.content is not None


def test_request_limit_answers_429_with_retry_after(gateway):
    key = gateway.key(rpm=2)
    openai_client = client(gateway, key)
    for _ in range(2):
        openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as error:
        openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    assert 1 <= int(error.value.response.headers["retry-after"]) <= 61
    assert error.value.body["code"] == "requests_per_minute_exceeded"
    assert error.value.body["type"] == "rate_limit_exceeded"


def test_tokens_per_minute_under_50_concurrent_clients_in_process(gateway):
    assert_tokens_per_minute_hold(gateway, limit=1500)


def assert_tokens_per_minute_hold(gateway, limit: int, concurrency: int = 50, max_tokens: int = 8) -> None:
    """50 clients send chat completions until each is refused. The tokens really used in a window may pass
    the limit only by what a request reserved too little; the gateway reserves prompt tokens (counted
    with the model's tokenizer) plus max_tokens, so the bound is concurrency times one request's tokens
    and the measured overshoot is reported."""
    key = gateway.key(tpm=limit)
    openai_client = client(gateway, key, http_client=httpx.Client(limits=httpx.Limits(max_connections=concurrency)))
    started = time.time()

    def one_client(_):
        used, refused = [], 0
        for _ in range(20):
            try:
                response = openai_client.chat.completions.create(
                    model=MODEL_NAME, messages=MESSAGES, max_tokens=max_tokens
                )
            except openai.RateLimitError:
                refused += 1
                break
            used.append(response.usage.total_tokens)
        return used, refused

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        outcomes = list(pool.map(one_client, range(concurrency)))
    ended = time.time()
    tokens = [t for used, _ in outcomes for t in used]
    refused = sum(r for _, r in outcomes)
    windows = int(ended // 60) - int(started // 60) + 1  # minute windows the run touched
    per_request = max(tokens)
    bound = windows * limit + concurrency * per_request
    overshoot = sum(tokens) - windows * limit
    print(
        f"tpm limit {limit}: {len(tokens)} requests admitted using {sum(tokens)} tokens over {windows} "
        f"window(s), {refused} refused; overshoot {overshoot} tokens (bound {concurrency} x {per_request})"
    )
    assert refused == concurrency  # every client met the limit
    assert sum(tokens) <= bound
    assert sum(tokens) >= limit - concurrency * per_request  # the limit, not something else, stopped them


def test_backend_killed_under_load_no_client_sees_a_failure(vllm_backends, gateway_llm_path, tmp_path):
    """Non-streaming requests from region eu while the eu backend is killed: requests in flight on it and
    after it are retried on us before any byte reached the client. This gateway never spills over by
    latency, so eu has all the traffic until it dies. The eu backend stays down for the rest of the
    session; the other gateways route around it."""
    config = gateway_config(vllm_backends, gateway_llm_path, f"sqlite:///{tmp_path}/gateway.db")
    config["settings"]["spill_factor"] = 1000
    gateway = GatewayProcess(config, tmp_path)
    key = gateway.key()
    openai_client = client(gateway, key, default_headers={"X-Mlplane-Region": "eu"})
    requests, killed_after = 60, 15
    done = []

    def one(_):
        response = openai_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16)
        done.append(1)
        return response.usage.completion_tokens

    eu = vllm_backends["eu"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(requests)]
        deadline = time.time() + 300
        while len(done) < killed_after and time.time() < deadline:
            time.sleep(0.05)
        eu.kill()
        results = [f.result() for f in futures]  # raises if any client saw an error
    assert len(results) == requests
    rows = usage_rows(gateway, requests, group_by="key_id,region,status")
    mine = {(r["region"], r["status"]): r["requests"] for r in rows if r["key_id"] == key.split("-")[2]}
    assert sum(mine.values()) == requests and set(mine) == {("eu", 200), ("us", 200)}
    metrics = gateway.metrics()
    assert f'mlplane_gateway_backend_healthy{{backend="{eu.url}",model="{MODEL_NAME}",region="eu"}} 0.0' in metrics
    retries = [line for line in metrics.splitlines() if line.startswith("mlplane_gateway_retries_total")]
    assert retries and float(retries[0].split()[-1]) > 0
    gateway.stop()


def test_hot_reload_adds_a_group_without_dropping_requests(gateway, vllm_backends, gateway_llm_path):
    key = gateway.key()
    openai_client = client(gateway, key)
    alias = {"model_name": "gateway-llm-alias", "url": vllm_backends["us"].url, "model": MODEL_NAME, "region": "us"}
    original = gateway.config
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [
            pool.submit(openai_client.chat.completions.create, model=MODEL_NAME, messages=MESSAGES, max_tokens=16)
            for _ in range(24)
        ]
        gateway.rewrite({**original, "model_list": [*original["model_list"], alias]})
        assert all(f.result().model == MODEL_NAME for f in futures)
    for _ in range(100):
        if "gateway-llm-alias" in {m.id for m in openai_client.models.list()}:
            break
        time.sleep(0.1)
    response = openai_client.chat.completions.create(model="gateway-llm-alias", messages=MESSAGES, max_tokens=2)
    assert response.model == "gateway-llm-alias"
    gateway.rewrite({**original, "model_list": "not a list"})  # a broken file keeps the running config
    assert gateway.admin("POST", "/admin/reload").status_code == 400
    response = openai_client.chat.completions.create(model="gateway-llm-alias", messages=MESSAGES, max_tokens=2)
    assert response.model == "gateway-llm-alias"
    gateway.rewrite(original)


def test_open_inference_protocol_v2_pass_through(gateway):
    key = gateway.key(models=["adder"])
    auth = {"Authorization": f"Bearer {key}"}
    request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1.0, 2.0, 3.5]}]}
    answer = httpx.post(f"{gateway.url}/v2/models/adder/infer", json=request, headers=auth, timeout=30)
    assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [6.5]
    assert httpx.get(f"{gateway.url}/v2/models/adder", headers=auth, timeout=30).json()["name"] == "adder"
    denied = httpx.post(f"{gateway.url}/v2/models/{MODEL_NAME}/infer", json=request, headers=auth, timeout=30)
    assert denied.status_code == 404  # a chat model is no v2 model
    other = gateway.key(models=[MODEL_NAME])
    refused = httpx.post(
        f"{gateway.url}/v2/models/adder/infer", json=request, timeout=30, headers={"Authorization": f"Bearer {other}"}
    )
    assert refused.status_code == 403


def test_metrics_and_openapi(gateway):
    key = gateway.key()
    client(gateway, key).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    metrics = gateway.metrics()
    for name in (
        "mlplane_gateway_requests_total",
        "mlplane_gateway_tokens_total",
        "mlplane_gateway_request_latency_seconds_bucket",
        "mlplane_gateway_backend_healthy",
        "mlplane_gateway_backend_latency_ewma_seconds",
    ):
        assert name in metrics
    assert f'mlplane_gateway_requests_total{{endpoint="chat",model="{MODEL_NAME}",status="200"}}' in metrics
    spec = httpx.get(f"{gateway.url}/openapi.json", timeout=30).json()
    assert {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/v2/models/{name}/infer",
        "/admin/keys",
        "/admin/teams",
        "/metrics",
    } <= set(spec["paths"])
    # every request body and answer is described, so client generators and fuzzers get the real shapes
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    assert chat["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
    assert chat["responses"]["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    schemas = spec["components"]["schemas"]
    assert {"messages", "max_tokens", "n", "stream_options"} <= set(schemas["ChatCompletionRequest"]["properties"])
    assert schemas["KeyCreate"]["properties"]["models"]["type"] == "array"
    assert {"inputs"} <= set(schemas["InferRequest"]["required"])
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer" and chat["security"]


def test_gateway_resource_calls_models_with_a_service_key(gateway):
    resource = GatewayResource(url=gateway.url, api_key=gateway.key(owner="dagster", team="platform"), region="us")
    answer = resource.chat(MODEL_NAME, MESSAGES, max_tokens=4)
    assert answer["model"] == MODEL_NAME and answer["usage"]["completion_tokens"] <= 4
    vectors = resource.embed(EMBEDDING_MODEL, ["a", "b", "c"])
    assert len(vectors) == 3 and len(vectors[0]) == 128


def test_gateway_llm_asset_is_a_llama_in_hugging_face_format(gateway_llm_path):
    import json

    config = json.loads((gateway_llm_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["head_dim"] == 64
    assert (gateway_llm_path / "tokenizer.json").exists() and (gateway_llm_path / "model.safetensors").exists()
    training = json.loads((gateway_llm_path / "mlplane_training.json").read_text())
    assert training["held_out_perplexity"] < training["unigram_perplexity"]


def test_retries_before_the_first_byte_never_after_a_stream_started(vllm_backends, gateway_llm_path, tmp_path):
    """Region eu is the us vLLM server behind a proxy that drops connections: before any answer byte
    (cut_after=0) the gateway moves the streamed request to the direct backend; once a stream has
    sent its first events (cut_after=1500) the client gets the events so far and an error event, never a
    second answer from another backend."""
    us = vllm_backends["us"]
    for cut_after, streamed_fully in ((0, True), (1500, False)):
        proxy = CuttingProxy(us.port, cut_after)
        config = gateway_config(vllm_backends, gateway_llm_path, f"sqlite:///{tmp_path}/gateway-{cut_after}.db")
        config["model_list"][0]["url"] = proxy.url  # region eu, preferred by the callers below
        config["settings"].update(spill_factor=1000, circuit_failures=1000, health_interval_s=3600)
        workdir = tmp_path / str(cut_after)
        workdir.mkdir()
        gateway = GatewayProcess(config, workdir)
        try:
            openai_client = client(gateway, gateway.key(), default_headers={"X-Mlplane-Region": "eu"})
            if streamed_fully:
                chunks = list(
                    openai_client.chat.completions.create(
                        model=MODEL_NAME, messages=MESSAGES, max_tokens=8, stream=True
                    )
                )
                assert chunks[-1].choices[0].finish_reason in ("length", "stop")
            else:
                received = []
                with pytest.raises(openai.APIError, match="failed during the stream"):
                    for chunk in openai_client.chat.completions.create(
                        model=MODEL_NAME,
                        messages=MESSAGES,
                        max_tokens=200,
                        stream=True,
                        extra_body={"ignore_eos": True},
                    ):
                        received.append(chunk)
                assert received and all(c.choices[0].finish_reason is None for c in received)
            metrics = gateway.metrics()
            retried = [
                float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith("mlplane_gateway_retries_total")
            ]
            assert retried == ([1.0] if streamed_fully else [])
        finally:
            gateway.stop()
            proxy.close()
