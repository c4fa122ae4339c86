import httpx
from dagster import ConfigurableResource
from pydantic import Field


class WebhookNotifier(ConfigurableResource):
    """Posts JSON notifications (run failures, ...) to a webhook such as a Slack or Teams relay."""

    url: str | None = Field(default=None, description="Webhook URL; notifications are logged only when unset")
    timeout_seconds: float = 5.0

    def post(self, payload: dict) -> bool:
        if not self.url:
            return False
        response = httpx.post(self.url, json=payload, timeout=self.timeout_seconds)
        response.raise_for_status()
        return True
