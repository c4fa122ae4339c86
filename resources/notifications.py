import httpx
from dagster import ConfigurableResource
from pydantic import Field


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
