"""Cross-site request forgery and cookie rules of the labeling app.

A browser sends the session cookie with any request to the app, including one a foreign page starts.
So every state-changing request that rests on the cookie must prove it comes from the app's own pages:
forms carry a hidden `csrf` field and the pages' scripts an `x-csrf-token` header, each equal to the
`gt_csrf` cookie (double submit: a foreign page can neither read that cookie nor set it), and a request
whose Origin header names another site is refused outright. A request with a bearer token carries no
ambient credential and needs neither. Cookies are Secure everywhere but on localhost (where the app is
served over plain HTTP for development and tests)."""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, Response

CSRF_COOKIE = "gt_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def csrf_token(request: Request) -> str:
    """The token this browser's forms and scripts echo: its cookie's, or a new one (the page that embeds
    it sets the cookie with `remember_csrf`)."""
    if not hasattr(request.state, "csrf"):
        request.state.csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
    return request.state.csrf


def remember_csrf(request: Request, response: Response) -> None:
    if request.cookies.get(CSRF_COOKIE) != csrf_token(request):
        set_cookie(request, response, CSRF_COOKIE, csrf_token(request))


def set_cookie(request: Request, response: Response, name: str, value: str) -> None:
    response.set_cookie(name, value, httponly=True, samesite="strict", secure=needs_secure(request), path="/")


def needs_secure(request: Request) -> bool:
    return (request.url.hostname or "") not in LOCAL_HOSTS


def check_origin(request: Request) -> None:
    """Refuse a state-changing request that a page of another site started (browsers name it in Origin)."""
    if request.method in SAFE_METHODS:
        return
    origin = request.headers.get("origin")
    if origin is None:
        return
    # the host only: behind a TLS-terminating proxy the app itself is reached over http
    if urlsplit(origin).netloc != request.headers.get("host", ""):
        raise HTTPException(403, f"cross-site request refused (origin {origin!r})")


def check_form(request: Request, submitted: str | None) -> None:
    """A form post: same origin, and its hidden field equal to the browser's CSRF cookie."""
    check_origin(request)
    if not _matches(request.cookies.get(CSRF_COOKIE), submitted):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page and try again")


def check_cookie_call(request: Request) -> None:
    """A script's state-changing API call authenticated by the session cookie: same origin, and the CSRF
    header equal to the CSRF cookie."""
    if request.method in SAFE_METHODS:
        return
    check_origin(request)
    if not _matches(request.cookies.get(CSRF_COOKIE), request.headers.get(CSRF_HEADER)):
        raise HTTPException(403, f"a call signed in by cookie needs the {CSRF_HEADER} header of the app's pages")


def _matches(cookie: str | None, submitted: str | None) -> bool:
    if not cookie or not submitted:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())
