"""The server-sent-events relay between a backend's stream and the client, free of any HTTP client: it
renames the model to the public name, drops the usage chunk the gateway asked for on the client's
behalf, and tallies the usage the stream reports (or the choice chunks it carried, when it reports none)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from serving.gateway import fastjson

DONE = "data: [DONE]"


@dataclass
class StreamTally:
    prompt_tokens: int
    completion_tokens: int | None = None  # from the stream's usage chunk
    choice_chunks: int = 0
    finished: bool = False  # the backend's stream ended on its own

    @property
    def completion(self) -> int:
        """Completion tokens: the backend's count, else one a choice chunk (vLLM sends one token each)."""
        return self.completion_tokens if self.completion_tokens is not None else self.choice_chunks


def rewrite(line: str, tally: StreamTally, model: str, pass_usage: bool) -> str | None:
    """One line of the backend's stream as the client gets it, or None to drop it."""
    if not line.startswith("data: ") or line == DONE:
        return line + "\n"
    try:
        event = fastjson.loads_lenient(line[6:])
    except ValueError:
        return line + "\n"
    if not isinstance(event, dict):
        return line + "\n"
    usage = event.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            tally.prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            tally.completion_tokens = usage["completion_tokens"]
    if event.get("choices"):
        tally.choice_chunks += 1
    elif usage and not pass_usage:
        return None  # the usage chunk asked for on the client's behalf
    if "model" in event:
        event["model"] = model
    return "data: " + fastjson.dumps_text(event) + "\n"


async def relay(
    first: str, lines: AsyncIterator[str], tally: StreamTally, model: str, pass_usage: bool
) -> AsyncIterator[str]:
    """The client's stream. Errors of `lines` propagate (the caller decides what they mean);
    `tally.finished` is set only when the backend ended the stream."""
    line = first
    while True:
        out = rewrite(line, tally, model, pass_usage)
        if out is not None:
            yield out
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            tally.finished = True
            return


def error_event(message: str, code: str = "stream_interrupted") -> str:
    return (
        "data: "
        + json.dumps({"error": {"message": message, "type": "upstream_error", "code": code, "param": None}})
        + "\n\n"
    )
