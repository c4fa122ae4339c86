import httpx
from dagster import ConfigurableResource
from pydantic import Field


class GatewayError(RuntimeError):
    """The gateway answered with an error; the message carries its OpenAI-style body."""


class GatewayResource(ConfigurableResource):
    """Calls models through the ML gateway with a service key, so that assets share the platform's
    keys, rate limits, routing and usage records with every other caller."""

    url: str = Field(default="http://127.0.0.1:4000", description="The gateway's base URL")
    api_key: str | None = Field(default=None, description="A service key created with `mlplane gateway keys create`")
    region: str | None = Field(default=None, description="Preferred backend region")
    timeout_seconds: float = 120.0

    def _send(self, path: str, body: dict) -> httpx.Response:
        if not self.api_key:
            raise GatewayError("GatewayResource.api_key is not set (MLPLANE_GATEWAY_KEY)")
        headers = {"Authorization": f"Bearer {self.api_key}"}
        if self.region:
            headers["X-Mlplane-Region"] = self.region
        return httpx.post(f"{self.url.rstrip('/')}{path}", json=body, headers=headers, timeout=self.timeout_seconds)

    def _post(self, path: str, body: dict) -> dict:
        response = self._send(path, body)
        if response.status_code >= 400:
            raise GatewayError(f"gateway {path} answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def call(self, body: dict, path: str = "/v1/chat/completions") -> tuple[int, dict, object]:
        """(status, lower-cased headers, JSON body) of one call, errors included: for callers with their
        own retry policy (429s carry Retry-After)."""
        response = self._send(path, body)
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": {"message": response.text[:500]}}
        return response.status_code, {k.lower(): v for k, v in response.headers.items()}, payload

    def chat(self, model: str, messages: list[dict], **options) -> dict:
        """The whole chat completion response (choices, usage)."""
        return self._post("/v1/chat/completions", {"model": model, "messages": messages, **options})

    def complete(self, model: str, prompt: str, **options) -> str:
        return self._post("/v1/completions", {"model": model, "prompt": prompt, **options})["choices"][0]["text"]

    def embed(self, model: str, texts: list[str]) -> list[list[float]]:
        data = self._post("/v1/embeddings", {"model": model, "input": texts})["data"]
        return [row["embedding"] for row in sorted(data, key=lambda row: row["index"])]
