"""The gRPC front end: the Open Inference Protocol's `inference.GRPCInferenceService` (the protos
tritonclient ships), on the same server core as REST, so `tritonclient.grpc` works unchanged.
Tensors travel as raw contents (tritonclient's default) or typed contents; errors carry the status
code matching the REST status (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE)."""

from __future__ import annotations

import grpc
import numpy as np
from starlette.concurrency import run_in_threadpool
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from serving.models.auth import Keys, grpc_role
from serving.models.protocols import binary
from serving.models.protocols.protocol import (
    OFF_LOOP_BYTES,
    ProtocolError,
    RepositoryModel,
    RequestInput,
    datatype_of,
    decode_input,
    element_count,
)
from serving.models.server import EXTENSIONS, SERVER_NAME, SERVER_VERSION, ModelServer

STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters_of(parameters) -> dict:
    out = {}
    for key, value in parameters.items():
        kind = value.WhichOneof("parameter_choice")
        if kind is not None:
            out[key] = getattr(value, kind)
    return out


def decode_tensors(request) -> dict[str, np.ndarray]:
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise ProtocolError(400, f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    out: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        if tensor.name in out:
            raise ProtocolError(400, f"input {tensor.name!r} is given twice")
        spec = RequestInput(name=tensor.name, shape=list(tensor.shape), datatype=tensor.datatype)
        if raw:
            out[tensor.name] = binary.decode_binary(spec, raw[i])
            continue
        count = element_count(spec)
        field = CONTENTS_FIELD.get(tensor.datatype)
        if field is None:  # FP16 has no typed contents in the protocol
            raise ProtocolError(400, f"input {tensor.name!r}: {tensor.datatype} travels only as raw_input_contents")
        values = list(getattr(tensor.contents, field))
        if tensor.datatype != "BYTES":
            spec.data = values
            out[tensor.name] = decode_input(spec)
        elif len(values) != count:
            raise ProtocolError(
                400, f"input {tensor.name!r}: shape {spec.shape} needs {count} values, contents has {len(values)}"
            )
        else:
            out[tensor.name] = np.array(values or [], dtype=object).reshape(spec.shape)
    return out


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, server: ModelServer):
        self.server = server

    async def _fail(self, context, error: ProtocolError):
        await context.abort(STATUS_CODES.get(error.status, grpc.StatusCode.INVALID_ARGUMENT), error.message)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        states = self.server.repository.states.values()
        return pb.ServerReadyResponse(ready=all(s.current is not None for s in states if not s.unloaded))

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)

    async def ModelReady(self, request, context):
        try:
            return pb.ModelReadyResponse(ready=self.server.ready(request.name, request.version or None))
        except ProtocolError as error:
            await self._fail(context, error)

    async def ModelMetadata(self, request, context):
        try:
            meta = self.server.metadata(request.name, request.version or None)
        except ProtocolError as error:
            await self._fail(context, error)
        tensors = [
            [
                pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
                for t in meta[side]
            ]
            for side in ("inputs", "outputs")
        ]
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=tensors[0],
            outputs=tensors[1],
        )

    async def ModelInfer(self, request, context):
        try:
            self.server.check_model(request.model_name, request.model_version or None)  # before decoding
            if request.ByteSize() > OFF_LOOP_BYTES:
                inputs = await run_in_threadpool(decode_tensors, request)
            else:
                inputs = decode_tensors(request)
            name, version, outputs = await self.server.infer(
                request.model_name, request.model_version or None, inputs, parameters_of(request.parameters), "grpc"
            )
            wanted = [o.name for o in request.outputs] or list(outputs)
            unknown = sorted(set(wanted) - set(outputs))
            if unknown:
                raise ProtocolError(400, f"model {name!r} has no output(s) {unknown}; outputs: {sorted(outputs)}")
        except ProtocolError as error:
            await self._fail(context, error)
        response = pb.ModelInferResponse(model_name=name, model_version=version, id=request.id)
        for key in wanted:
            array = np.asarray(outputs[key])
            response.outputs.append(
                pb.ModelInferResponse.InferOutputTensor(name=key, datatype=datatype_of(array), shape=list(array.shape))
            )
            response.raw_output_contents.append(binary.to_bytes(array))
        return response

    async def RepositoryIndex(self, request, context):
        models = self.server.repository.index(ready_only=request.ready)
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(
                    name=m.name, version=m.version or "", state=m.state, reason=_reason(m)
                )
                for m in models
            ]
        )

    async def RepositoryModelLoad(self, request, context):
        try:
            await run_in_threadpool(
                self.server.repository.load, request.model_name, parameters_of(request.parameters) or None
            )
        except ProtocolError as error:
            await self._fail(context, error)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        try:
            await run_in_threadpool(self.server.repository.unload, request.model_name)
        except ProtocolError as error:
            await self._fail(context, error)
        return pb.RepositoryModelUnloadResponse()


def _reason(model: RepositoryModel) -> str:
    """The index's reason; gRPC's index has no field for a load's override, so it is said here."""
    if not model.overridden:
        return model.reason
    return "; ".join(filter(None, [f"follows {model.follows} (set by a load)", model.reason]))


class KeyCheck(grpc.aio.ServerInterceptor):
    """The REST keys over gRPC: a call without the credentials its method needs is answered
    UNAUTHENTICATED or PERMISSION_DENIED before its handler runs."""

    def __init__(self, keys: Keys):
        self.keys = keys

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        metadata = {key: value for key, value in details.invocation_metadata or ()}
        try:
            self.keys.check(grpc_role(details.method), metadata.get("authorization"))
        except ProtocolError as error:
            return _refusing(handler, STATUS_CODES[error.status], error.message)
        return handler


def _refusing(handler, code: grpc.StatusCode, message: str):
    async def refuse(request, context):
        await context.abort(code, message)

    if handler is None:  # an unknown method: gRPC answers UNIMPLEMENTED
        return None
    streaming = "stream" if handler.request_streaming else "unary", "stream" if handler.response_streaming else "unary"
    return handler._replace(**{"_".join(streaming): refuse})


class GrpcFrontEnd:
    def __init__(self, server: ModelServer, host: str, port: int):
        self.grpc = grpc.aio.server(
            interceptors=[KeyCheck(server.keys)],
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ],
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(server), self.grpc)
        self.port = self.grpc.add_insecure_port(f"{host}:{port}")

    async def start(self) -> None:
        await self.grpc.start()

    async def stop(self) -> None:
        await self.grpc.stop(grace=5)
