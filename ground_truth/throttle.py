"""Sign-in throttling: attempts per account and per client address in a sliding window, and the
password hashing on a small pool of its own, so a flood of sign-ins neither guesses far nor stalls
the annotators' other requests (which run on the server's shared thread pool)."""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class SignInThrottle:
    """Counts sign-in attempts that did not succeed (failed or still being checked) per account and per
    client address over the last `window_s` seconds. A successful sign-in forgets its account's attempts
    and its own attempt from the address, so colleagues signing in from one office address are not
    throttled by each other's successes."""

    def __init__(
        self,
        per_account: int = 10,
        per_address: int = 100,
        window_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limits = {"account": per_account, "address": per_address}
        self.window_s = window_s
        self.clock = clock
        self._attempts: dict[tuple[str, str], deque[float]] = {}
        self._lock = threading.Lock()

    def begin(self, username: str, address: str) -> int | None:
        """Record an attempt and return None, or return the seconds to wait when either limit is reached
        (the attempt is then not recorded and must not be checked)."""
        moment = self.clock()
        keys = (("account", username), ("address", address))
        with self._lock:
            self._prune(moment)
            waits = [self._wait(key, moment) for key in keys]
            if any(w is not None for w in waits):
                return max(w for w in waits if w is not None)
            for key in keys:
                self._attempts.setdefault(key, deque()).append(moment)
        return None

    def succeeded(self, username: str, address: str) -> None:
        with self._lock:
            self._attempts.pop(("account", username), None)
            if attempts := self._attempts.get(("address", address)):
                attempts.pop()

    def _wait(self, key: tuple[str, str], moment: float) -> int | None:
        attempts = self._attempts.get(key)
        if attempts is None or len(attempts) < self.limits[key[0]]:
            return None
        return max(1, math.ceil(attempts[0] + self.window_s - moment))

    def _prune(self, moment: float) -> None:
        """Drop attempts older than the window (and keys left empty), so memory stays bounded."""
        for key in list(self._attempts):
            attempts = self._attempts[key]
            while attempts and attempts[0] <= moment - self.window_s:
                attempts.popleft()
            if not attempts:
                del self._attempts[key]


class HashingPool:
    """Password checks on `workers` threads of their own: at most that many scrypt hashes (16 MiB each)
    run at once, and the server's shared pool stays free for the annotators' requests. The threads run at
    a lower CPU priority (Linux keeps a nice value per thread): a flood of sign-ins would otherwise take
    the cores the annotators' requests need, and a sign-in can wait where an answer should not."""

    def __init__(self, workers: int = 2, nice: int = 10):
        self._pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="sign-in", initializer=_lower_priority, initargs=(nice,)
        )

    async def run(self, function: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _lower_priority(nice: int) -> None:
    """Lower this thread's CPU priority by `nice` (where the platform has per-thread nice values)."""
    if hasattr(os, "setpriority") and hasattr(threading, "get_native_id"):
        try:
            thread = threading.get_native_id()  # relative: a thread starts at its creator's nice value
            os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + nice))
        except OSError:  # not permitted here: the hashing still runs, at the normal priority
            pass
