"""The admin API: API keys, team limits, usage reports and configuration reload. Every route needs
the admin key (compared in constant time); payloads are typed, so a wrong type is a 422 naming the field."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from serving.gateway.errors import GatewayError, from_validation, invalid, read_json
from serving.gateway.routes.deps import AdminDep
from serving.gateway.routes.openai import ERRORS, body_doc
from serving.gateway.schemas import (
    ErrorResponse,
    KeyCreate,
    KeyList,
    KeyRecord,
    KeyWithSecret,
    Reloaded,
    TeamList,
    TeamRecord,
    TeamSet,
    UsageRows,
)
from serving.gateway.service import Gateway

router = APIRouter(tags=["admin"], prefix="/admin", responses=ERRORS)
KeyId = str
GROUPS = "(backend|endpoint|key_id|model|region|status|team)"  # the usage report's columns
CONFLICT = {409: {"model": ErrorResponse, "description": "The key is revoked"}}


async def payload(request: Request, gateway: Gateway, model: type[BaseModel]):
    body, _ = await read_json(request, gateway.settings.max_body_bytes, gateway.settings.max_json_depth)
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise from_validation(error, status=422) from None


def not_found(error: KeyError) -> GatewayError:
    return invalid(error.args[0], status=404, code="key_not_found")


@router.post(
    "/keys",
    summary="Create an API key",
    status_code=201,
    response_model=KeyWithSecret,
    openapi_extra=body_doc(KeyCreate),
)
async def create_key(request: Request, gateway: AdminDep):
    spec = await payload(request, gateway, KeyCreate)
    try:
        secret, record = await asyncio.to_thread(gateway.store.create_key, **spec.model_dump())
    except ValueError as error:
        raise invalid(str(error), status=422) from error
    return JSONResponse({"key": secret, **record.public()}, status_code=201)


@router.get("/keys", summary="List API keys (never their secrets)", response_model=KeyList)
async def list_keys(gateway: AdminDep):
    return {"data": [k.public() for k in await asyncio.to_thread(gateway.store.list_keys)]}


@router.post(
    "/keys/{key_id}/revoke",
    summary="Revoke an API key (every replica refuses it within a second)",
    response_model=KeyRecord,
)
async def revoke_key(key_id: KeyId, gateway: AdminDep):
    try:
        record = await asyncio.to_thread(gateway.store.revoke_key, key_id)
    except KeyError as error:
        raise not_found(error) from error
    gateway.key_cache.clear()
    return record.public()


@router.post(
    "/keys/{key_id}/rotate", summary="Give an API key a new secret", response_model=KeyWithSecret, responses=CONFLICT
)
async def rotate_key(key_id: KeyId, gateway: AdminDep):
    try:
        secret, record = await asyncio.to_thread(gateway.store.rotate_key, key_id)
    except KeyError as error:
        raise not_found(error) from error
    except ValueError as error:
        raise invalid(str(error), status=409, code="key_revoked") from error
    gateway.key_cache.clear()
    return {"key": secret, **record.public()}


@router.put(
    "/teams",
    summary="Set a team's limits (shared by all its keys); a limit left out is none",
    response_model=TeamRecord,
    openapi_extra=body_doc(TeamSet),
)
async def set_team(request: Request, gateway: AdminDep):
    spec = await payload(request, gateway, TeamSet)
    record = await asyncio.to_thread(gateway.store.set_team, **spec.model_dump())
    gateway.key_cache.clear()
    return record.public()


@router.get("/teams", summary="Teams and their limits", response_model=TeamList)
async def list_teams(gateway: AdminDep):
    return {"data": [t.public() for t in await asyncio.to_thread(gateway.store.list_teams)]}


@router.get("/usage", summary="Usage report: requests and tokens per group", response_model=UsageRows)
async def usage_report(
    gateway: AdminDep,
    since: Annotated[float, Query(allow_inf_nan=False)] = 0.0,
    until: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    group_by: Annotated[str, Query(pattern=rf"^{GROUPS}(,{GROUPS})*$")] = "key_id,team,model",
):
    await gateway.usage.flush()  # every request answered before the report is in it
    try:
        rows = await asyncio.to_thread(gateway.store.usage_report, since, until, tuple(group_by.split(",")))
    except ValueError as error:
        raise invalid(str(error), "group_by") from error
    return {"data": rows}


@router.post("/reload", summary="Reload the configuration file now", response_model=Reloaded)
async def reload(gateway: AdminDep):
    if not gateway.reload():
        raise invalid("The configuration file is invalid; the running one is kept (see the log)", code="invalid_config")
    return {"models": sorted(gateway.router.groups)}
