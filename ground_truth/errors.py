"""Errors as their callers read them: JSON `{"detail": ...}` for the API (under /api/), an HTML page
for people everywhere else, each with the status and the problem named."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException

from ground_truth import pages
from ground_truth import queue as q
from ground_truth.accounts import AccountExists


class Throttled(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"too many sign-in attempts for this account or address: try again in {retry_after} s")
        self.retry_after = retry_after
        self.headers = {"retry-after": str(retry_after)}


def problem(request: Request, status: int, detail: str, headers: Mapping[str, str] | None = None) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)
    page = pages.error(status, detail, request.url.path)
    return HTMLResponse(page, status_code=status, headers={**(headers or {}), "cache-control": "no-store"})


def install_error_pages(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    def http_error(request: Request, error: HTTPException):
        if 300 <= error.status_code < 400:  # a page's redirect (to sign in)
            return Response(status_code=error.status_code, headers=error.headers)
        return problem(request, error.status_code, str(error.detail), error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError):
        if request.url.path.startswith("/api/"):
            return await request_validation_exception_handler(request, error)
        named = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in error.errors())
        return problem(request, 422, named)

    status_of = {
        Throttled: 429,
        q.NotFound: 404,
        q.Conflict: 409,
        AccountExists: 409,
        ValueError: 422,
        q.Busy: 503,
    }
    for kind, status in status_of.items():
        app.add_exception_handler(kind, _handler(status))

    @app.exception_handler(OperationalError)
    def unavailable(request: Request, error: OperationalError):
        return problem(request, 503, f"the label database is unavailable: {error.orig}")


def _handler(status: int):
    def handle(request: Request, error: Exception):
        headers = getattr(error, "headers", None) or ({"retry-after": "1"} if status == 503 else None)
        return problem(request, status, str(error), headers)

    return handle
