"""The ML gateway: one OpenAI-compatible API over model backends in several regions, with API keys,
entitlements, token-count rate limits, latency-aware routing, usage records and Prometheus metrics.
A separate long-running service; it never imports Dagster."""
