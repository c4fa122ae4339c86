"""JSON on the request path through orjson (a fraction of the json module's time per request), with the
json module behind it wherever orjson would read or write something differently: what orjson accepts
here, the strict reader in errors.py would accept with the same values, and every body orjson refuses
is read again by that reader (which then names the problem, or accepts it exactly as before)."""

from __future__ import annotations

import json
import re

import orjson
from starlette.responses import JSONResponse

# orjson reads integers past 64 bits (above 2**64 - 1 or below -2**63) as floats: a body holding 20
# digits in a row, or a minus and 19, takes the json module
LONG_DIGITS, LONG_DIGITS_TEXT = re.compile(rb"\d{20}|-\d{19}"), re.compile(r"\d{20}|-\d{19}")


def loads(raw: bytes | str) -> object | None:
    """orjson's reading of `raw`, or None where the json module must read it: orjson refused it (NaN,
    Infinity, a number out of range, a lone surrogate, invalid UTF-8, over 1,024 levels) or it holds an
    integer orjson would turn into a float."""
    if (LONG_DIGITS_TEXT if isinstance(raw, str) else LONG_DIGITS).search(raw) is not None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def loads_lenient(raw: bytes | str) -> object:
    """A backend's JSON as the json module reads it (non-finite numbers included), through orjson when
    it can; a ValueError when it is not JSON."""
    value = loads(raw)
    return json.loads(raw) if value is None else value


def dumps_text(value) -> str:
    return dumps(value).decode()


def dumps(value) -> bytes:
    """Compact UTF-8 JSON. Integers past 64 bits (orjson refuses them) go through the json module."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


class FastJSONResponse(JSONResponse):
    """starlette's JSONResponse rendered by orjson."""

    def render(self, content) -> bytes:
        return dumps(content)
