"""The gateway's routers: OpenAI-compatible (/v1), Open Inference Protocol v2 (/v2), admin (/admin)
and operations (/health, /metrics)."""
