"""Prometheus metrics of one gateway process (its own registry, so several apps can live in a test).
The per-request counters and histograms are plain numbers updated on the event loop and read by the
registry on scrape: prometheus_client's own take a lock and check their state on every update (about
5 us a request for the five updates of a request)."""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class CounterChild:
    __slots__ = ("value",)

    def __init__(self):
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket whose bound is >= value
        self.sum += value


class LoopCounter:
    """A labelled counter for the event loop's thread only, exposed as prometheus_client's Counter is."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], registry: CollectorRegistry):
        self._name, self.documentation, self.labelnames = name, documentation, labelnames
        self.children: dict[tuple[str, ...], CounterChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> CounterChild:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = CounterChild()
        return child

    def collect(self):
        family = CounterMetricFamily(self._name, self.documentation, labels=self.labelnames)
        for values, child in list(self.children.items()):
            family.add_metric(values, child.value)
        yield family


class LoopHistogram:
    """A labelled histogram for the event loop's thread only, exposed as prometheus_client's Histogram is."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], buckets, registry: CollectorRegistry):
        self._name, self.documentation, self.labelnames = name, documentation, labelnames
        self.bounds = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = HistogramChild(self.bounds)
        return child

    def collect(self):
        family = HistogramMetricFamily(self._name, self.documentation, labels=self.labelnames)
        names = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for values, child in list(self.children.items()):
            cumulative, total = [], 0
            for name, count in zip(names, child.counts):
                total += count
                cumulative.append((name, total))
            family.add_metric(values, cumulative, child.sum)
        yield family


class GatewayMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = LoopCounter(
            "mlplane_gateway_requests",
            "Requests by model, endpoint and status",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.tokens = LoopCounter(
            "mlplane_gateway_tokens", "Tokens by model and kind (prompt, completion)", ["model", "kind"], registry=r
        )
        self.latency = LoopHistogram(
            "mlplane_gateway_request_latency_seconds",
            "Request latency seen by clients",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = LoopHistogram(
            "mlplane_gateway_time_to_first_token_seconds",
            "Time to first streamed byte",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rate_limited = LoopCounter(
            "mlplane_gateway_rate_limited",
            "Requests rejected by a rate limit",
            ["scope_kind", "unit", "period"],
            registry=r,
        )
        self.retries = LoopCounter(
            "mlplane_gateway_retries", "Attempts moved to another backend before the first byte", ["model"], registry=r
        )
        self.backend_requests = LoopCounter(
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

    @staticmethod
    def child(metric, *labels: str):
        """`metric.labels(*labels)` (kept for the call sites: one dict lookup, no lock)."""
        return metric.labels(*labels)

    def observe_backends(self, groups: dict) -> None:
        for model, states in groups.items():
            for state in states:
                labels = (model, state.spec.url, state.spec.region)
                self.backend_healthy.labels(*labels).set(1 if state.healthy else 0)
                self.backend_circuit_open.labels(*labels).set(1 if state.circuit() == "open" else 0)
                self.backend_in_flight.labels(*labels).set(state.in_flight)
                self.backend_latency.labels(*labels).set(state.latency_s or 0)
                self.backend_ttft.labels(*labels).set(state.ttft_s or 0)
