"""Prometheus metrics of one gateway process (its own registry, so several apps can live in a test)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "mlplane_gateway_requests",
            "Requests by model, endpoint and status",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.tokens = Counter(
            "mlplane_gateway_tokens", "Tokens by model and kind (prompt, completion)", ["model", "kind"], registry=r
        )
        self.latency = Histogram(
            "mlplane_gateway_request_latency_seconds",
            "Request latency seen by clients",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "mlplane_gateway_time_to_first_token_seconds",
            "Time to first streamed byte",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rate_limited = Counter(
            "mlplane_gateway_rate_limited",
            "Requests rejected by a rate limit",
            ["scope_kind", "unit", "period"],
            registry=r,
        )
        self.retries = Counter(
            "mlplane_gateway_retries", "Attempts moved to another backend before the first byte", ["model"], registry=r
        )
        self.backend_requests = Counter(
            "mlplane_gateway_backend_requests",
            "Upstream attempts by outcome",
            ["backend", "region", "outcome"],
            registry=r,
        )
        labels = ["model", "backend", "region"]
        self.backend_healthy = Gauge(
            "mlplane_gateway_backend_healthy", "1 when the health check passes", labels, registry=r
        )
        self.backend_circuit_open = Gauge(
            "mlplane_gateway_backend_circuit_open", "1 while the circuit is open", labels, registry=r
        )
        self.backend_in_flight = Gauge("mlplane_gateway_backend_in_flight", "Requests in flight", labels, registry=r)
        self.backend_latency = Gauge(
            "mlplane_gateway_backend_latency_ewma_seconds", "Moving latency estimate", labels, registry=r
        )
        self.backend_ttft = Gauge(
            "mlplane_gateway_backend_ttft_ewma_seconds", "Moving time-to-first-token estimate", labels, registry=r
        )
        self._children: dict[tuple, object] = {}

    def child(self, metric, *labels: str):
        """`metric.labels(*labels)`, looked up once: prometheus_client validates and locks on every call,
        several microseconds a request on the hot path."""
        key = (metric._name, labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) > 100_000:  # bounded: statuses and models are few, but never trust that
                self._children.clear()
            found = self._children[key] = metric.labels(*labels)
        return found

    def observe_backends(self, groups: dict) -> None:
        for model, states in groups.items():
            for state in states:
                labels = (model, state.spec.url, state.spec.region)
                self.backend_healthy.labels(*labels).set(1 if state.healthy else 0)
                self.backend_circuit_open.labels(*labels).set(1 if state.circuit() == "open" else 0)
                self.backend_in_flight.labels(*labels).set(state.in_flight)
                self.backend_latency.labels(*labels).set(state.latency_s or 0)
                self.backend_ttft.labels(*labels).set(state.ttft_s or 0)
