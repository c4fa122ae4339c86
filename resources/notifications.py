import httpx
from dagster import ConfigurableResource
from pydantic import BaseModel, Field


class Delivery(BaseModel):
    """Where one notification went: the webhooks that took it, the target names with no webhook
    configured, and the webhooks that refused it or could not be reached (with why)."""

    posted: list[str] = []
    unknown: list[str] = []
    failed: dict[str, str] = {}


class WebhookNotifier(ConfigurableResource):
    """Posts JSON notifications (run failures, ...) to a webhook such as a Slack or Teams relay."""

    url: str | None = Field(default=None, description="Webhook URL; notifications are logged only when unset")
    targets: dict[str, str] = Field(
        default_factory=dict, description="Named webhooks that pipelines ask for with notify=(name, ...)"
    )
    timeout_seconds: float = 5.0

    def post(self, payload: dict, url: str | None = None) -> bool:
        url = url or self.url
        if not url:
            return False
        response = httpx.post(url, json=payload, timeout=self.timeout_seconds)
        response.raise_for_status()
        return True

    def post_to_targets(self, names: list[str], payload: dict) -> tuple[list[str], list[str]]:
        """Post to each named target; returns (the names posted to, the names with no webhook configured)."""
        posted = [name for name in names if name in self.targets and self.post(payload, self.targets[name])]
        return posted, [name for name in names if name not in self.targets]

    def deliver(self, payload: dict, names: list[str]) -> Delivery:
        """Post to the default webhook and to each named target, never raising: a webhook that is down
        is reported in the result, for the caller to retry or log. Webhooks are named, not shown: their
        URLs often hold a token."""
        webhooks = {"MLPLANE_WEBHOOK_URL": self.url} if self.url else {}
        webhooks.update({name: self.targets[name] for name in names if name in self.targets})
        delivery = Delivery(unknown=[name for name in names if name not in self.targets])
        for name, url in webhooks.items():
            try:
                self.post(payload, url)
                delivery.posted.append(name)
            except httpx.HTTPError as error:
                status = isinstance(error, httpx.HTTPStatusError) and f"HTTP {error.response.status_code}"
                delivery.failed[name] = status or type(error).__name__
        return delivery
