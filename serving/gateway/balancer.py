"""Latency-aware choice of a backend within a model group.

Each backend keeps moving averages (EWMA) of its latency and time to first token and a count of
requests in flight. Its load-adjusted cost is `latency * (1 + in_flight / capacity) / weight`. The
caller's region is preferred unless its best backend costs more than `spill_factor` times the best
elsewhere, or none there is available. Unhealthy backends, open circuits and full backends are skipped;
a circuit opens after `failures` consecutive failures and lets one trial request through after
`open_s` seconds (half-open).

Failures are booked per key as well: each key's failures in a row count toward the shared circuit only
up to its budget (`key_failure_budget`, one by default); past `failures` in a row the key has a circuit
of its own on that backend, which only its requests see. So one key whose requests crash a backend
cannot make it unavailable to everyone, while an outage every key sees still opens the shared circuit."""

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
    key_failures: dict[str, int] = field(default_factory=dict)  # key -> its failures here since its last success
    key_open_until: dict[str, float] = field(default_factory=dict)  # key -> when its own circuit here half-opens
    clock: object = field(default=time.monotonic, repr=False)

    def circuit(self) -> str:
        if self.open_until == 0.0:
            return "closed"
        return "open" if self.clock() < self.open_until else "half_open"

    def available(self, key_id: str | None = None) -> bool:
        if not self.healthy or self.in_flight >= self.spec.capacity or self.key_circuit_open(key_id):
            return False
        state = self.circuit()
        return state == "closed" or (state == "half_open" and not self.half_open_trial)

    def key_circuit_open(self, key_id: str | None) -> bool:
        until = self.key_open_until.get(key_id) if key_id is not None else None
        return until is not None and self.clock() < until

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
        self,
        ok: bool,
        latency_s: float | None,
        ttft_s: float | None,
        failures_to_open: int,
        open_s: float,
        key_id: str | None = None,
        key_budget: int = 1,
    ) -> None:
        """Books an attempt's outcome; `key_id` names the caller (None: counted as before keys)."""
        self.in_flight -= 1
        self.half_open_trial = False
        if ok:
            self.consecutive_failures = 0
            self.open_until = 0.0
            self.key_failures.pop(key_id, None)
            self.key_open_until.pop(key_id, None)
            if latency_s is not None:
                self.latency_s = _ewma(self.latency_s, latency_s)
            if ttft_s is not None:
                self.ttft_s = _ewma(self.ttft_s, ttft_s)
            return
        if key_id is not None and self._key_over_budget(key_id, failures_to_open, open_s, key_budget):
            return
        self.consecutive_failures += 1
        if self.consecutive_failures >= failures_to_open or self.circuit() != "closed":
            self.open_until = self.clock() + open_s

    def _key_over_budget(self, key_id: str, failures_to_open: int, open_s: float, key_budget: int) -> bool:
        """Books a failure of `key_id`, opening its own circuit here after `failures_to_open` in a row;
        True when the key has spent its share of the shared circuit's count."""
        failures = self.key_failures[key_id] = self.key_failures.get(key_id, 0) + 1
        if failures >= failures_to_open:
            self.key_open_until[key_id] = self.clock() + open_s
        return failures > key_budget


def _ewma(previous: float | None, sample: float) -> float:
    return sample if previous is None else (1 - EWMA_ALPHA) * previous + EWMA_ALPHA * sample


def choose(
    backends: list[BackendState],
    region: str | None,
    exclude: set[str],
    spill_factor: float,
    rng: random.Random = random,
    key_id: str | None = None,
) -> BackendState | None:
    """The backend for the next attempt of `key_id`'s request, or None when every one is excluded or
    unavailable (to that key)."""
    if len(backends) == 1:  # nothing to weigh
        only = backends[0]
        return only if only.spec.id not in exclude and only.available(key_id) else None
    candidates = [b for b in backends if b.spec.id not in exclude and b.available(key_id)]
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
