"""Latency-aware choice of a backend within a model group.

Each backend keeps moving averages (EWMA) of its latency and time to first token and a count of
requests in flight. Its load-adjusted cost is `latency * (1 + in_flight / capacity) / weight`. The
caller's region is preferred unless its best backend costs more than `spill_factor` times the best
elsewhere, or none there is available. Unhealthy backends, open circuits and full backends are skipped;
a circuit opens after `failures` consecutive failures and lets one trial request through after
`open_s` seconds (half-open)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from serving.gateway.config import BackendSpec

EWMA_ALPHA = 0.2
UNMEASURED_LATENCY_S = 0.05  # optimistic start, so that a new backend gets traffic and a measurement


@dataclass
class BackendState:
    spec: BackendSpec
    latency_s: float | None = None
    ttft_s: float | None = None
    in_flight: int = 0
    healthy: bool = True
    consecutive_failures: int = 0
    open_until: float = 0.0
    half_open_trial: bool = False
    clock: object = field(default=time.monotonic, repr=False)

    def circuit(self) -> str:
        if self.open_until == 0.0:
            return "closed"
        return "open" if self.clock() < self.open_until else "half_open"

    def available(self) -> bool:
        if not self.healthy or self.in_flight >= self.spec.capacity:
            return False
        state = self.circuit()
        return state == "closed" or (state == "half_open" and not self.half_open_trial)

    def cost(self) -> float:
        latency = self.latency_s if self.latency_s is not None else UNMEASURED_LATENCY_S
        return latency * (1 + self.in_flight / self.spec.capacity) / self.spec.weight

    def start(self) -> None:
        self.in_flight += 1
        if self.circuit() == "half_open":
            self.half_open_trial = True

    def release(self) -> None:
        """Ends a request that says nothing about the backend (the client went away): frees its slot
        and a half-open trial, counting neither a success nor a failure."""
        self.in_flight -= 1
        self.half_open_trial = False

    def finish(
        self, ok: bool, latency_s: float | None, ttft_s: float | None, failures_to_open: int, open_s: float
    ) -> None:
        self.in_flight -= 1
        self.half_open_trial = False
        if ok:
            self.consecutive_failures = 0
            self.open_until = 0.0
            if latency_s is not None:
                self.latency_s = _ewma(self.latency_s, latency_s)
            if ttft_s is not None:
                self.ttft_s = _ewma(self.ttft_s, ttft_s)
            return
        self.consecutive_failures += 1
        if self.consecutive_failures >= failures_to_open or self.circuit() != "closed":
            self.open_until = self.clock() + open_s


def _ewma(previous: float | None, sample: float) -> float:
    return sample if previous is None else (1 - EWMA_ALPHA) * previous + EWMA_ALPHA * sample


def choose(
    backends: list[BackendState],
    region: str | None,
    exclude: set[str],
    spill_factor: float,
    rng: random.Random = random,
) -> BackendState | None:
    """The backend for the next attempt, or None when every one is excluded or unavailable."""
    if len(backends) == 1:  # nothing to weigh
        only = backends[0]
        return only if only.spec.id not in exclude and only.available() else None
    candidates = [b for b in backends if b.spec.id not in exclude and b.available()]
    if not candidates:
        return None
    best = _cheapest(candidates, rng)
    if region:
        local = [b for b in candidates if b.spec.region == region]
        if local:
            best_local = _cheapest(local, rng)
            if best_local.cost() <= spill_factor * best.cost():
                return best_local
    return best


def _cheapest(backends: list[BackendState], rng) -> BackendState:
    lowest = min(b.cost() for b in backends)
    ties = [b for b in backends if b.cost() <= lowest * 1.05]
    return rng.choices(ties, weights=[b.spec.weight for b in ties])[0]
