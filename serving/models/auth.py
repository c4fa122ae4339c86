"""Who may call what, over REST and gRPC alike. Control calls (repository load and unload) need an
admin key, and are refused when none is set: a server is never open to control by default. Data-plane
calls (inference, recommend, features, metadata) need a key where a data key is set (an admin key
works there too). Health probes, metrics and the OpenAPI document stay open. Keys come from two
places: the environment variables the config names (read once, at start) and the key file that
`mlplane models keys` edits (re-read when it changes). They travel as `Authorization: Bearer <key>`
(gRPC metadata `authorization`) and are compared in constant time."""

from __future__ import annotations

import hmac
import os
import re
from dataclasses import dataclass, field

from serving.api_docs import is_docs_path
from serving.models.config import ServerConfig
from serving.models.key_file import KeyFile
from serving.models.protocols.protocol import ProtocolError

ADMIN, DATA, OPEN = "admin", "data", "open"

# REST: a path ending so is a control call (searched, not anchored, so a root path cannot hide one)
CONTROL_PATH = re.compile(r"/v2/repository/models/[^/]+/(load|unload)$")
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics", "/openapi.json"})
# gRPC: inference.GRPCInferenceService's method names
CONTROL_METHODS = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})
OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})


def rest_role(path: str) -> str:
    if CONTROL_PATH.search(path):
        return ADMIN
    return OPEN if path in OPEN_PATHS or is_docs_path(path) else DATA


def grpc_role(method: str) -> str:
    name = method.rsplit("/", 1)[-1]  # "/inference.GRPCInferenceService/ModelInfer"
    if name in CONTROL_METHODS:
        return ADMIN
    return OPEN if name in OPEN_METHODS else DATA


@dataclass(frozen=True)
class Keys:
    """The keys a server accepts: the environment's, read once at start, and the key file's."""

    admin: bytes | None = field(default=None, repr=False)
    data: bytes | None = field(default=None, repr=False)
    admin_setting: str = "MLPLANE_MODEL_SERVER_ADMIN_KEY"
    file: KeyFile | None = None

    @classmethod
    def of(cls, config: ServerConfig) -> Keys:
        def key(variable: str) -> bytes | None:
            return os.environ.get(variable, "").encode() or None

        keys_file = KeyFile(config.keys_path())
        return cls(key(config.admin_key_env), key(config.data_key_env), config.admin_key_env, keys_file)

    def check(self, role: str, authorization: str | None) -> None:
        """Nothing when the call may go on; ProtocolError 401 (no credentials) or 403 (not these) otherwise."""
        if role == OPEN or (role == DATA and not self._keyed(DATA)):
            return
        if role == ADMIN and not self._keyed(ADMIN):
            raise ProtocolError(
                403,
                f"control calls are refused: no admin key is set ({self.admin_setting}, "
                "or `mlplane models keys create NAME --role admin`)",
            )
        given = _bearer(authorization)
        if given is None:
            raise ProtocolError(401, "credentials needed: send 'Authorization: Bearer <key>'")
        if not self._accepts(role, given):
            raise ProtocolError(403, "this key may not make " + ("control calls" if role == ADMIN else "this call"))

    def _keyed(self, role: str) -> bool:
        own = self.admin if role == ADMIN else self.data
        return own is not None or bool(self.file and self.file.digests(role))

    def _accepts(self, role: str, given: bytes) -> bool:
        roles = (ADMIN,) if role == ADMIN else (DATA, ADMIN)
        from_env = (self.admin,) if role == ADMIN else (self.data, self.admin)
        accepted = False
        for key in from_env:  # every candidate compared: the time taken does not say which matched
            accepted |= key is not None and hmac.compare_digest(given, key)
        return (self.file is not None and self.file.matches(given, roles)) | accepted


def _bearer(authorization: str | None) -> bytes | None:
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode("utf-8", "surrogateescape")
