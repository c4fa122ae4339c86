"""Prometheus metrics of the model server, in their own registry (one server per process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "mlplane_model_requests",
            "Inference requests answered",
            ["model", "version", "protocol"],
            registry=self.registry,
        )
        self.errors = Counter(
            "mlplane_model_errors",
            "Requests answered with an error, by status",
            ["model", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "mlplane_model_request_seconds",
            "Request latency in the server",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "mlplane_model_batch_size",
            "Rows per model call (dynamic batching)",
            ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.feature_read = Histogram(
            "mlplane_feature_read_seconds",
            "Online feature reads",
            ["service"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.retrieval = Histogram(
            "mlplane_retrieval_seconds",
            "Candidate retrieval from the vector database",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.loads = Counter(
            "mlplane_model_loads", "Model versions loaded, by outcome", ["model", "outcome"], registry=self.registry
        )

        self.shadows = Counter(
            "mlplane_shadow_requests",
            "Shadow copies of requests, by outcome (ok, error, skipped when the shadows fall behind)",
            ["shadow", "outcome"],
            registry=self.registry,
        )
        self.log_backlog = Gauge(
            "mlplane_prediction_log_backlog", "Prediction log records not yet in the lake", registry=self.registry
        )
        self.log_failures = Counter(
            "mlplane_prediction_log_write_failures",
            "Prediction log writes the lake refused (records kept and retried)",
            registry=self.registry,
        )

    def shadow(self, name: str, outcome: str) -> None:
        self.shadows.labels(name, outcome).inc()

    def log_state(self, backlog: int, failed: bool) -> None:
        self.log_backlog.set(backlog)
        if failed:
            self.log_failures.inc()

    def observe(self, model: str, version: str, protocol: str, seconds: float) -> None:
        self.requests.labels(model, version, protocol).inc()
        self.latency.labels(model, version).observe(seconds)

    def error(self, model: str, status: int) -> None:
        self.errors.labels(model, str(status)).inc()

    def batch_observer(self, model: str):
        histogram = self.batch_size.labels(model)
        return histogram.observe

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
