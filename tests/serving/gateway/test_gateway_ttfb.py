"""The time-to-first-byte limit on backend calls (settings.first_byte_timeout_s), apart from the limit
between reads (settings.request_timeout_s): a backend that accepts a request and never answers is cut
at the first-byte limit, however long the read limit; an answer that has begun is held only to the
read limit, so a long stream that keeps sending is never cut by the first-byte limit.

The backends are stand-ins for vLLM (outside the platform): the scripted socket of
tests/serving/test_gateway_http1.py for the client alone, and the fake of fake_vllm.py behind a gateway
process. Each wait is bounded by a read limit of an hour: a test that passes was cut by the first-byte
limit, not by the other."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from serving.gateway.http1 import Pool, UpstreamTimeout
from tests.serving.conftest import GatewayProcess
from tests.serving.gateway.fake_vllm import FakeVllm
from tests.serving.test_gateway_http1 import Backend, run

HOUR = 3600.0


async def never_answers(writer) -> bool:
    await asyncio.sleep(HOUR)
    return False


def streams(chunks: int, gap_s: float):
    """A chunked answer that begins at once, then sends a line every `gap_s`."""

    async def reply(writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for index in range(chunks):
            await writer.drain()
            await asyncio.sleep(gap_s)
            line = b"data: %d\n\n" % index
            writer.write(b"%x\r\n%b\r\n" % (len(line), line))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return reply


def test_a_backend_that_never_answers_is_cut_at_the_first_byte_limit():
    async def scenario():
        backend = Backend([never_answers])
        url = await backend.start()
        pool = Pool(1.0, HOUR, first_byte_timeout_s=0.5)
        with pytest.raises(UpstreamTimeout, match="did not begin its answer within 0.5 s"):
            await pool.request("POST", url, "/v1/chat/completions", b"{}")
        await backend.stop()

    run(scenario())


def test_a_stream_longer_than_the_first_byte_limit_is_not_cut():
    async def scenario():
        backend = Backend([streams(chunks=8, gap_s=0.25)])  # 2 s in all, four times the first-byte limit
        url = await backend.start()
        pool = Pool(1.0, HOUR, first_byte_timeout_s=0.5)
        response = await pool.request("POST", url, "/v1/chat/completions", b"{}")
        lines = [line async for line in response.lines() if line]
        assert lines == [f"data: {i}" for i in range(8)]
        await backend.stop()

    run(scenario())


def test_once_an_answer_began_the_read_limit_holds_not_the_first_byte_limit():
    async def begins_then_stalls(writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        return await never_answers(writer)

    async def scenario():
        backend = Backend([begins_then_stalls])
        url = await backend.start()
        pool = Pool(1.0, 0.5, first_byte_timeout_s=HOUR)
        response = await pool.request("POST", url, "/v1/completions", b"{}")
        with pytest.raises(UpstreamTimeout, match="sent nothing more within 0.5 s"):
            await response.read()
        await backend.stop()

    run(scenario())


@pytest.mark.services  # a gateway process
def test_the_gateway_answers_502_at_the_first_byte_limit_and_relays_long_streams(tmp_path):
    silent, slow = FakeVllm(hang=True), FakeVllm(stream_gap_s=0.3)
    config = {
        "model_list": [
            {"model_name": "silent", "url": silent.url, "max_tokens": 8},
            {"model_name": "slow", "url": slow.url, "max_tokens": 8},
        ],
        "settings": {
            "store": f"sqlite:///{tmp_path}/gateway.db",
            "usage_spill_dir": str(tmp_path / "spill"),
            "first_byte_timeout_s": 1.0,
            "request_timeout_s": HOUR,
            "health_interval_s": HOUR,  # probes are answered; only requests hang
        },
    }
    gateway = GatewayProcess(config, tmp_path)
    try:
        headers = {"Authorization": f"Bearer {gateway.key()}"}
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        cut = httpx.post(
            f"{gateway.url}/v1/chat/completions", json={**chat, "model": "silent"}, headers=headers, timeout=HOUR
        )
        assert cut.status_code == 502 and cut.json()["error"]["code"] == "backend_failed", cut.text
        assert silent.requests == 1  # one backend in the group: nothing else to try
        body = {**chat, "model": "slow", "stream": True}  # 8 tokens 0.3 s apart: past the first-byte limit
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=HOUR) as s:
            events = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert s.status_code == 200 and events[-1] == "data: [DONE]"
        assert sum('"content": "ok "' in e or '"content":"ok "' in e for e in events) == 8, events
    finally:
        gateway.stop()
        silent.close()
        slow.close()
