"""FastAPI dependencies shared by the routers: the authenticated caller and the admin check (the admin
key compared in constant time). Each reads the request itself: no sub-dependencies to solve per request,
and async, since FastAPI runs a plain function in a worker thread. The bearer scheme is declared in the
OpenAPI document by the app."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from serving.gateway.errors import GatewayError
from serving.gateway.service import Caller, Gateway

REGION_HEADER = "x-mlplane-region"


def gateway_in(request: Request) -> Gateway:
    return request.app.state.gateway


def bearer_secret(request: Request) -> str:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else ""


async def caller(request: Request) -> Caller:
    return await gateway_in(request).authenticate(bearer_secret(request))


def is_admin(gateway: Gateway, secret: str) -> bool:
    expected = gateway.config.admin_key
    return expected is not None and expected != "" and hmac.compare_digest(secret.encode(), expected.encode())


async def admin(request: Request) -> Gateway:
    gateway = gateway_in(request)
    if not gateway.config.admin_key:
        raise GatewayError(
            403,
            f"The admin API is disabled: set {gateway.settings.admin_key_env}",
            "permission_error",
            "admin_disabled",
        )
    if not is_admin(gateway, bearer_secret(request)):
        raise GatewayError(401, "The admin API needs the admin key", "invalid_request_error", "invalid_api_key")
    return gateway


CallerDep = Annotated[Caller, Depends(caller)]
AdminDep = Annotated[Gateway, Depends(admin)]


def region_of(request: Request) -> str | None:
    return request.headers.get(REGION_HEADER) or None
