"""Property-based fuzzing of the running gateway in front of the real vLLM backends: schemathesis over
the gateway's own OpenAPI document, and hypothesis on hostile request bodies (NaN, surrogates, junk
types, deep values). After every case: no 5xx, no circuit opened, no slot held, and a usage record for
every request that got past authentication. Case counts are bounded to keep the suite fast."""

from __future__ import annotations

import json
import time
import uuid
import zlib

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serving.conftest import MODEL_NAME
from tests.serving.gateway.test_gateway_hostile import settled

RECORDED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v2/models/")
FUZZ = settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


class Ledger:
    """The fuzz key and the requests it made that must each have a usage record."""

    def __init__(self, gateway):
        self.gateway = gateway
        self.key = gateway.key(owner="fuzz", team=f"fuzz-{uuid.uuid4().hex[:6]}", tpm=50_000)
        self.key_id = self.key.split("-")[2]
        self.expected = 0

    def check(self, path: str, response_status: int, text: str) -> None:
        assert response_status < 500, (path, response_status, text[:500])
        if path.startswith(RECORDED) and response_status != 401:
            self.expected += 1
        states = settled(self.gateway)
        assert all(s["in_flight"] == 0 and s["circuit_open"] == 0 for s in states.values()), states
        deadline = time.time() + 20
        while True:
            rows = self.gateway.admin("GET", "/admin/usage", params={"group_by": "key_id"}).json()["data"]
            recorded = sum(r["requests"] for r in rows if r["key_id"] == self.key_id)
            if recorded == self.expected or time.time() > deadline:
                break
            time.sleep(0.1)
        assert recorded == self.expected, (path, recorded, self.expected)


@pytest.fixture(scope="module")
def ledger(gateway) -> Ledger:
    return Ledger(gateway)


def operations(gateway) -> list:
    """The gateway's own /v1 and /v2 operations, read from its OpenAPI document."""
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json").include(path_regex=r"^/(v1|v2)/")
    return [result.ok() for result in schema.get_all_operations()]


def test_openapi_document_fuzz(gateway, ledger):
    """Cases generated from the document itself, a bounded number per operation; half of them name a
    real model, so they reach vLLM instead of stopping at a 404."""
    found = operations(gateway)
    assert {op.path for op in found} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v2/models/{name}/infer",
    }
    for operation in found:

        @given(case=operation.as_strategy())
        @FUZZ
        def run(case):
            real = zlib.crc32(repr((case.body, case.path_parameters)).encode()) % 2 == 0
            if real and isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = MODEL_NAME
            if real and case.path_parameters and "name" in case.path_parameters:
                case.path_parameters["name"] = "adder"
            response = case.call(base_url=gateway.url, timeout=120, headers={"Authorization": f"Bearer {ledger.key}"})
            ledger.check(case.formatted_path, response.status_code, response.text)

        run()


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(st.characters(codec=None) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=6)
)
junk = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
content = st.one_of(
    st.text(max_size=30),
    st.none(),
    junk,
    st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(["text", "image_url", 3]),
                "text": st.one_of(st.none(), st.text(max_size=10), junk),
            }
        ),
        max_size=2,
    ),
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "robot", None]), "content": content}
)
chat_body = st.fixed_dictionaries(
    {
        "model": st.sampled_from([MODEL_NAME, MODEL_NAME, "no-such-model", 7]),
        "messages": st.one_of(st.lists(message, min_size=1, max_size=3), junk),
    },
    optional={
        "max_tokens": st.one_of(st.integers(-1, 12), junk),
        "max_completion_tokens": st.integers(0, 12),
        "n": st.integers(-1, 3),
        "stream": st.one_of(st.booleans(), junk),
        "stream_options": st.one_of(st.just({"include_usage": True}), junk),
        "temperature": st.floats(allow_nan=True, allow_infinity=True),
        "top_p": st.one_of(st.floats(0, 1), junk),
        "stop": st.one_of(st.text(max_size=3), junk),
        "extra": junk,
    },
)


@given(body=chat_body)
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_hostile_chat_bodies(gateway, ledger, body):
    raw = json.dumps(body, allow_nan=True).encode()  # NaN, Infinity and lone surrogates go out as written
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=raw,
        timeout=120,
        headers={"Authorization": f"Bearer {ledger.key}", "content-type": "application/json"},
    )
    ledger.check("/v1/chat/completions", response.status_code, response.text)
