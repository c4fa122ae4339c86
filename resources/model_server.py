from __future__ import annotations

import os

import httpx
from dagster import ConfigurableResource
from pydantic import Field


class ModelServerError(RuntimeError):
    """The model server answered with an error; the message carries its `{"error": ...}` body."""


class ModelServerResource(ConfigurableResource):
    """The online model server (`mlplane serve models`): on localhost by default, the deployed service's
    URL in production (`MLPLANE_MODEL_SERVER_URL`)."""

    url: str | None = Field(
        default="http://127.0.0.1:8500", description="The server's REST base URL; None: no server (prod, unset)"
    )
    config_path: str | None = Field(
        default=None,
        description="The server's YAML (what it serves; read by the "
        "KServe/Triton export); None: the local server's default",
    )
    timeout_seconds: float = 30.0
    admin_key_env: str = Field(
        default="MLPLANE_MODEL_SERVER_ADMIN_KEY", description="The variable holding the key of load and unload"
    )
    data_key_env: str = Field(
        default="MLPLANE_MODEL_SERVER_KEY",
        description="The variable holding the data-plane key, if any",
    )

    def base_url(self) -> str:
        if not self.url:
            raise ModelServerError("no model server URL is configured (MLPLANE_MODEL_SERVER_URL)")
        return self.url.rstrip("/")

    def _call(self, method: str, path: str, body: dict | None = None, admin: bool = False) -> dict | list:
        key = os.environ.get(self.admin_key_env if admin else self.data_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = httpx.request(
            method, f"{self.base_url()}{path}", json=body, headers=headers, timeout=self.timeout_seconds
        )
        if response.status_code >= 400:
            raise ModelServerError(f"model server {path} answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.base_url()}/v2/health/ready", timeout=self.timeout_seconds).status_code == 200
        except httpx.HTTPError:
            return False

    def models(self) -> list[dict]:
        """Every configured model with the version it serves and why not, if it does not."""
        return self._call("POST", "/v2/repository/index", {})

    def load(self, name: str, version: str | None = None, alias: str | None = None) -> dict:
        parameters = {"version": version} if version else {"alias": alias} if alias else None
        return self._call("POST", f"/v2/repository/models/{name}/load", {"parameters": parameters}, admin=True)

    def recommend(self, user_id: int, k: int = 10, context: dict | None = None) -> dict:
        return self._call("POST", "/recommend", {"user_id": user_id, "k": k, "context": context or {}})

    def infer(self, model: str, inputs: list[dict], version: str | None = None) -> dict:
        """OIP v2 JSON inference; `inputs` as the protocol's tensors (name, datatype, shape, data)."""
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        return self._call("POST", path, {"inputs": inputs})
