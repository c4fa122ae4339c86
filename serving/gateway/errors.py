"""Errors answered in OpenAI's shape, and the strict JSON reader every route uses: a hostile body is a
4xx naming the problem, never a 500."""

from __future__ import annotations

import json
import re

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from serving.gateway import fastjson
from serving.gateway.config import location

LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class GatewayError(Exception):
    """An error answered to the client in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, status: int = 400, code: str = "invalid_value") -> GatewayError:
    return GatewayError(status, message, "invalid_request_error", code, param)


def unavailable(message: str, code: str, retry_after_s: int = 1) -> GatewayError:
    return GatewayError(503, message, "service_unavailable", code, headers={"Retry-After": str(retry_after_s)})


UNION_TAGS = {"str", "int", "float", "bool", "none"}


def from_validation(error: ValidationError, status: int = 400) -> GatewayError:
    """One problem of a pydantic validation, naming its field. A value that fits none of a union's
    types gets an error per type: the one it breaks by its content (a string too short) says more
    than those it breaks by its type, and the deepest says where."""
    errors = error.errors()
    worst = min(range(len(errors)), key=lambda i: (errors[i]["type"].endswith("_type"), -len(errors[i]["loc"]), i))
    param = location(tuple(part for part in errors[worst]["loc"] if not _union_tag(part)))
    return invalid(f"Invalid '{param}': {errors[worst]['msg']}", param, status)


def _union_tag(part) -> bool:
    """Whether a location part names a union's member type ('list[constrained-str]'), not a field."""
    return isinstance(part, str) and (part in UNION_TAGS or "[" in part or "-" in part or part[:1].isupper())


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text} is out of range")
    return value


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def parse_json(raw: bytes, max_depth: int) -> dict:
    """Strict JSON: no NaN or Infinity (Python's json accepts them, the backends' clients refuse them),
    no lone UTF-16 surrogates, nesting at most `max_depth` deep, an object at the top. orjson reads it
    when it can (it refuses all of these but the depth itself); the json module reads the rest and names
    the problem."""
    body = fastjson.loads(raw)
    if isinstance(body, dict):
        check_shape(body, max_depth, False)
        return body
    try:
        body = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite)
    except RecursionError as error:
        raise invalid(f"The request body is nested more than {max_depth} levels deep", code="invalid_json") from error
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise invalid(f"The request body is not valid JSON: {error}", code="invalid_json") from error
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object", code="invalid_json")
    check_shape(body, max_depth, LONE_SURROGATE_ESCAPE.search(raw) is not None)
    return body


def check_shape(body, max_depth: int, check_strings: bool) -> None:
    """Iterative (a deep body must not recurse here either)."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            raise invalid(f"The request body is nested more than {max_depth} levels deep", code="invalid_json")
        children = value.values() if isinstance(value, dict) else value
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            elif check_strings and isinstance(child, str):
                _encodable(child)
        if check_strings and isinstance(value, dict):
            for name in value:
                _encodable(name)


def _encodable(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise invalid(
            "The request body holds a lone UTF-16 surrogate (\\ud800-\\udfff) in a string", code="invalid_json"
        ) from error


async def read_json(request: Request, max_bytes: int, max_depth: int) -> tuple[dict, int]:
    """The request body as a JSON object and its size in bytes, or a 4xx naming the problem."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise invalid(
            f"Request body of {declared} bytes is over the limit of {max_bytes} bytes",
            status=413,
            code="request_too_large",
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise invalid(f"Request body is over the limit of {max_bytes} bytes", status=413, code="request_too_large")
        chunks.append(chunk)
    return parse_json(b"".join(chunks), max_depth), size


def error_handlers() -> dict:
    async def gateway_error(_request, error: GatewayError):
        return error.response()

    async def validation_error(_request, error):  # FastAPI's query and path parameters
        first = error.errors()[0]
        param = location(tuple(p for p in first["loc"] if p not in ("body", "query", "path")))
        return invalid(f"Invalid '{param}': {first['msg']}", param, status=422).response()

    async def http_error(request, error: HTTPException):  # no such route, or not with this method
        headers = dict(error.headers or {})
        if error.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        kind = "invalid_request_error" if error.status_code < 500 else "internal_error"
        return GatewayError(error.status_code, str(error.detail), kind, headers=headers).response()

    return {GatewayError: gateway_error, RequestValidationError: validation_error, HTTPException: http_error}


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (Starlette's 405 names only the first
    matching route's, and GET and POST of one path are two routes here)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if getattr(route, "methods", None) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return sorted(methods)
