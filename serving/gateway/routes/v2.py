"""Open Inference Protocol v2 pass-through: model metadata and inference, with the same keys,
entitlements, request limits and usage records as the OpenAI routes (v2 calls carry no tokens)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from pydantic import ValidationError

from serving.gateway.errors import from_validation, read_json
from serving.gateway.exchange import Exchange
from serving.gateway.routes.deps import CallerDep, gateway_in, region_of
from serving.gateway.routes.openai import ERRORS, body_doc
from serving.gateway.schemas import ErrorResponse, InferRequest, InferResponse, V2Error, V2ModelMetadata
from serving.gateway.service import Caller, Gateway
from serving.gateway.upstream import forward

router = APIRouter(tags=["open inference protocol v2"])
# the gateway's refusals are OpenAI-shaped; a backend's 4xx comes as the backend sent it
V2_ERRORS = {status: {"model": ErrorResponse | V2Error} for status in ERRORS}
ModelName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")]


async def v2_call(request: Request, gateway: Gateway, who: Caller, name: str, method: str, suffix: str):
    settings = gateway.settings
    async with Exchange(gateway, who, "v2", name if name in gateway.router.groups else "unknown") as exchange:
        group = gateway.group_for(who, name, "v2")
        body = None
        if method == "POST":
            body, _size = await read_json(request, settings.max_body_bytes, settings.max_json_depth)
            try:
                InferRequest.model_validate(body)
            except ValidationError as error:
                raise from_validation(error) from None
        await exchange.admit(0)
        answer = await forward(
            gateway,
            exchange,
            group,
            method,
            lambda s: f"/v2/models/{s.spec.model}{suffix}",
            body,
            region_of(request),
            parse_json=False,
        )
        await exchange.finish(answer.status)
        return Response(answer.content, status_code=answer.status, media_type=answer.content_type)


@router.get(
    "/v2/models/{name}", summary="Model metadata (pass-through)", response_model=V2ModelMetadata, responses=V2_ERRORS
)
async def v2_metadata(request: Request, name: ModelName, who: CallerDep):
    return await v2_call(request, gateway_in(request), who, name, "GET", "")


@router.post(
    "/v2/models/{name}/infer",
    summary="Inference (pass-through)",
    response_model=InferResponse,
    responses=V2_ERRORS,
    openapi_extra=body_doc(InferRequest),
)
async def v2_infer(request: Request, name: ModelName, who: CallerDep):
    return await v2_call(request, gateway_in(request), who, name, "POST", "/infer")
