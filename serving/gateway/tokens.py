"""Prompt token counts before a call: the model's own tokenizer (a `tokenizers` tokenizer.json) where
the config names one, else an estimate of four characters a token."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

PER_MESSAGE_OVERHEAD = 4  # role and separators of a chat template


@lru_cache(maxsize=32)
def load_tokenizer(path: str):
    from tokenizers import Tokenizer

    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.exists():
        raise FileNotFoundError(f"tokenizer {file} not found")
    return Tokenizer.from_file(str(file))


class TokenCounter:
    def __init__(self, tokenizer_path: str | None):
        self.tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else None

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return len(text) // 4 + 1

    def prompt_tokens(self, endpoint: str, body: dict) -> int:
        if endpoint == "chat":
            messages = body.get("messages") or []
            return sum(
                PER_MESSAGE_OVERHEAD + self.count(_text(m.get("content")) if isinstance(m, dict) else "")
                for m in messages
            )
        field = body.get("prompt") if endpoint == "completions" else body.get("input")
        items = field if isinstance(field, list) and field and not isinstance(field[0], int) else [field]
        total = 0
        for item in items:
            total += len(item) if isinstance(item, list) else self.count(_text(item))
        return total


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return json.dumps(content)
