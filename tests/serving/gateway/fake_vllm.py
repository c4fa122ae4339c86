"""A fake of vLLM's OpenAI server, run in a thread of the test process. vLLM is outside the platform
(the gateway's own tests run it for real, tests/serving/gateway/conftest.py); this fake answers in its
shapes (a chat completion, text completion, embedding list, server-sent events with a usage chunk) with
no model behind them, so the gateway's own behaviour can be driven fast and on cue: `hang` accepts a
request and never answers; `stream_gap_s` sends a stream's chunks that far apart; `hold` keeps every
answer until the test sets it."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time

import uvicorn

from tests.serving.conftest import EMBEDDING_MODEL, MODEL_NAME, GatewayProcess, free_port, read_body

ids = itertools.count(1)


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def chat_completion(model: str, choices: int, tokens: int) -> dict:
    return {
        "id": f"chatcmpl-{next(ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": "ok " * tokens, "tool_calls": []},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
            for i in range(choices)
        ],
        "usage": usage(3, tokens * choices),
    }


def text_completion(model: str, choices: int, tokens: int) -> dict:
    return {
        "id": f"cmpl-{next(ids)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": "ok " * tokens, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            for i in range(choices)
        ],
        "usage": usage(3, tokens * choices),
    }


def embedding_list(model: str, inputs: int) -> dict:
    return {
        "id": f"embd-{next(ids)}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "embedding", "embedding": [0.25, -0.5, 1.0]} for i in range(inputs)],
        "usage": usage(3, 0),
    }


def stream_events(model: str, tokens: int, text: bool = False) -> list[bytes]:
    """vLLM's chat (or text) stream with include_usage: one chunk per token (a chat's first says the
    role), the usage chunk, [DONE]."""
    kind = "text_completion" if text else "chat.completion.chunk"

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        choice = {"index": 0, "text": delta.get("content", "")} if text else {"index": 0, "delta": delta}
        choice.update(logprobs=None, finish_reason=finish)
        event = {"id": "cmpl-stream", "object": kind, "created": int(time.time()), "model": model, "choices": [choice]}
        return f"data: {json.dumps(event)}\n\n".encode()

    events = [] if text else [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": "ok "}, "length" if i == tokens - 1 else None) for i in range(tokens)]
    final = {"id": "cmpl-stream", "object": kind, "created": 0, "model": model}
    events.append(f"data: {json.dumps({**final, 'choices': [], 'usage': usage(3, tokens)})}\n\n".encode())
    events.append(b"data: [DONE]\n\n")
    return events


def v2_answer(path: str, body: dict) -> tuple[int, dict]:
    """A stand-in for the platform's model server behind a v2 backend: an `adder` model summing each
    input's numbers, refusing what it cannot sum with a 400 naming the input, as the real one does."""
    if path == "/v2/models/adder":
        return 200, {
            "name": "adder",
            "platform": "python",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        }
    if path != "/v2/models/adder/infer":
        return 404, {"error": f"no route {path}"}
    outputs = []
    for tensor in body["inputs"]:
        data = tensor["data"]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in data):
            return 400, {"error": f"input '{tensor['name']}': data must be numbers"}
        outputs.append({"name": f"sum_{tensor['name']}", "datatype": "FP64", "shape": [1], "data": [sum(data)]})
    return 200, {"model_name": "adder", "outputs": outputs}


class FakeVllm:
    """The fake server; `requests` counts the generation requests it received."""

    def __init__(self, hang: bool = False, stream_gap_s: float = 0.0):
        self.hang, self.stream_gap_s = hang, stream_gap_s
        self.hold: threading.Event | None = None  # set by a test to hold answers until it is set
        self.requests = 0
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, port=self.port, log_level="warning", lifespan="off", interface="asgi3")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def app(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        path = scope["path"]
        if path in ("/health", "/v2/health/ready"):
            return await self.answer(send, 200, b"")
        self.requests += 1
        if self.hang:  # accepted, never answered: waits until the gateway hangs up
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        while self.hold is not None and not self.hold.is_set():
            await asyncio.sleep(0.01)
        body = json.loads(raw) if raw else {}
        model = body.get("model", "?")
        tokens = min(body.get("max_completion_tokens") or body.get("max_tokens") or 4, 8)
        choices = body.get("n") or 1
        if path.startswith("/v2/"):
            return await self.answer(send, *v2_answer(path, body))
        if path in ("/v1/chat/completions", "/v1/completions") and body.get("stream"):
            return await self.stream(send, stream_events(model, tokens, path == "/v1/completions"))
        if path == "/v1/chat/completions":
            return await self.answer(send, 200, chat_completion(model, choices, tokens))
        if path == "/v1/completions":
            prompts = body["prompt"] if isinstance(body["prompt"], list) and body["prompt"] else [body["prompt"]]
            many = isinstance(prompts[0], str | list)
            return await self.answer(send, 200, text_completion(model, choices * (len(prompts) if many else 1), tokens))
        if path == "/v1/embeddings":
            inputs = (
                body["input"] if isinstance(body["input"], list) and isinstance(body["input"][0], str | list) else [0]
            )
            return await self.answer(send, 200, embedding_list(model, len(inputs)))
        return await self.answer(send, 404, {"object": "error", "message": "Not Found", "type": "NotFoundError"})

    @staticmethod
    async def answer(send, status: int, payload) -> None:
        content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def stream(self, send, events: list[bytes]) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(self.stream_gap_s)
        await send({"type": "http.response.body", "body": b""})


def gateway_over(fake: FakeVllm, workdir, **settings) -> GatewayProcess:
    """A gateway process (as in production) whose backends are all the fake: the chat and embedding
    models and the v2 `adder`."""
    config = {
        "model_list": [
            {"model_name": MODEL_NAME, "url": fake.url, "region": "eu", "max_tokens": 8},
            {"model_name": EMBEDDING_MODEL, "url": fake.url, "region": "eu"},
            {"model_name": "adder", "kind": "v2", "url": fake.url, "region": "eu"},
        ],
        "settings": {
            "store": f"sqlite:///{workdir}/gateway.db",
            "usage_spill_dir": str(workdir / "usage_spill"),
            "max_body_bytes": 65_536,
            "key_cache_s": 0,
            **settings,
        },
    }
    return GatewayProcess(config, workdir)
