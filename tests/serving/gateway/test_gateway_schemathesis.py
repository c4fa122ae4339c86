"""Schemathesis' own runner with every check (`--checks all`: statuses, content types, headers, bodies
and server-sent events as documented, schema-valid requests accepted, invalid ones refused, methods
and their Allow header, authentication) over the gateway's /openapi.json: no failure and no warning.
The data plane is run with an API key, then the admin API, /health and /metrics with the admin key
(its stateful phase revokes keys). The statuses allowed by design are listed in schemathesis.toml.

The backends are a fake of vLLM (tests/serving/gateway/fake_vllm.py; vLLM is outside the platform,
and test_gateway_fuzz.py fuzzes the gateway in front of the real one): the document's model names are
served, so generated requests reach a backend, the fake answers in vLLM's shapes at once, and a run
of every check takes seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving.conftest import ADMIN_KEY
from tests.serving.gateway.fake_vllm import FakeVllm, gateway_over


@pytest.fixture(scope="module")
def fake_backed(tmp_path_factory):
    fake = FakeVllm()
    gateway = gateway_over(fake, tmp_path_factory.mktemp("schemathesis_gateway"))
    yield fake, gateway
    gateway.stop()
    fake.close()


def schemathesis(url: str, key: str, paths: str, folder: Path) -> subprocess.CompletedProcess:
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "--config-file",
        str(Path(__file__).parent / "schemathesis.toml"),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        "40",
        "--seed",
        "42",
        "--no-color",
        "--include-path-regex",
        paths,
        "--header",
        f"Authorization: Bearer {key}",
    ]
    # its example database (.schemathesis/) goes to the working folder: not the checkout
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=folder)


def passed(run: subprocess.CompletedProcess) -> bool:
    """No failure, and none of the warnings that say the run did not reach the API's logic (every
    request refused for its credentials, or every one naming a model that does not exist)."""
    return run.returncode == 0 and " passed" in run.stdout and "WARNINGS" not in run.stdout


@pytest.mark.services  # a gateway process, fuzzed over its OpenAPI document
def test_every_schemathesis_check_passes(fake_backed, tmp_path):
    fake, gateway = fake_backed
    key = gateway.key(owner="schemathesis", team="fuzz")
    data_plane = schemathesis(gateway.url, key, r"^/(v1|v2)/", tmp_path)
    assert passed(data_plane), data_plane.stdout[-6000:] + data_plane.stderr[-2000:]
    assert fake.requests > 100  # generated requests got past the gateway's checks to a backend
    control = schemathesis(gateway.url, ADMIN_KEY, r"^/(admin|health|metrics)", tmp_path)
    assert passed(control), control.stdout[-6000:] + control.stderr[-2000:]


@pytest.mark.parametrize(
    "body, message",
    [
        ({"model": "m", "prompt": ""}, "Invalid 'prompt': String should have at least 1 character"),
        ({"model": "m", "prompt": ["a", ""]}, "Invalid 'prompt[1]': String should have at least 1 character"),
        ({"model": "m", "prompt": [[1], []]}, "Invalid 'prompt[1]': List should have at least 1 item"),
        ({"model": "m", "prompt": "a", "stop": ["a", 1]}, "Invalid 'stop[1]': Input should be a valid string"),
        ({"model": "m", "prompt": "a", "temperature": True}, "Invalid 'temperature': Input should be a valid number"),
    ],
)
def test_a_refusal_names_the_field_not_a_union_member(body, message):
    """A value that fits none of a union's types is refused naming the field and what is wrong with
    the value, never a pydantic member tag such as 'prompt.constrained-str'."""
    from pydantic import ValidationError

    from serving.gateway.errors import from_validation
    from serving.gateway.schemas import CompletionRequest

    with pytest.raises(ValidationError) as refused:
        CompletionRequest.model_validate(body)
    assert from_validation(refused.value).message.startswith(message)
