"""FastAPI dependencies shared by the routers: the Gateway of the app, the authenticated caller and the
admin check (the admin key compared in constant time)."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serving.gateway.errors import GatewayError
from serving.gateway.service import Caller, Gateway

# every dependency is async: FastAPI runs a plain function in a worker thread, per request

bearer = HTTPBearer(auto_error=False, description="An API key (sk-mlp-...), or the admin key for /admin")
REGION_HEADER = "x-mlplane-region"


async def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(gateway_of)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def secret_of(credentials: HTTPAuthorizationCredentials | None) -> str:
    return credentials.credentials if credentials is not None else ""


async def caller(credentials: Credentials, gateway: GatewayDep) -> Caller:
    return await gateway.authenticate(f"Bearer {secret_of(credentials)}")


def is_admin(gateway: Gateway, secret: str) -> bool:
    expected = gateway.config.admin_key
    return bool(expected) and hmac.compare_digest(secret.encode(), expected.encode())


async def admin(credentials: Credentials, gateway: GatewayDep) -> Gateway:
    if not gateway.config.admin_key:
        raise GatewayError(403, f"The admin API is disabled: set {gateway.settings.admin_key_env}",
                           "permission_error", "admin_disabled")
    if not is_admin(gateway, secret_of(credentials)):
        raise GatewayError(401, "The admin API needs the admin key", "invalid_request_error", "invalid_api_key")
    return gateway


CallerDep = Annotated[Caller, Depends(caller)]
AdminDep = Annotated[Gateway, Depends(admin)]


def region_of(request: Request) -> str | None:
    return request.headers.get(REGION_HEADER) or None
