"""Usage records written off the request path: the handler puts one record on a queue and a
background task writes batches to the store, one transaction per half second at most (a store commit
per request costs more CPU than the rest of a request). `flush()` writes what is queued at once (the
admin usage report calls it, so a report shows every request answered before it); shutdown drains the
queue, so a clean stop loses none."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("mlplane.gateway.usage")
BATCH = 500
LINGER_S = 0.5  # gather a batch: one store transaction per half second under load, not one per request
FLUSH_WAIT_S = 10.0  # the most a flush waits for a store that keeps failing
STOP = object()


class UsageWriter:
    def __init__(self, store):
        self.store = store
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.hurry = asyncio.Event()  # set by flush(): end the linger now
        self.queued = 0  # records put on the queue so far
        self.written = 0  # records handed to the store (or given up on) so far
        self.waiters: list[tuple[int, asyncio.Future]] = []  # flushes: (records they wait for, future)

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="usage-writer")

    def record(self, record: dict) -> None:
        self.queued += 1
        self.queue.put_nowait(record)

    async def flush(self) -> None:
        """Waits until every record queued before the call is written (at most FLUSH_WAIT_S)."""
        if self.task is None or self.task.done() or self.written >= self.queued:
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append((self.queued, waiter))
        self.hurry.set()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), FLUSH_WAIT_S)
        except TimeoutError:
            log.warning("usage records not written within %g s of a flush", FLUSH_WAIT_S)

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = []
            item = await self.queue.get()
            if item is not STOP and not self.hurry.is_set():
                try:
                    await asyncio.wait_for(self.hurry.wait(), LINGER_S)
                except TimeoutError:
                    pass
            self.hurry.clear()
            while True:
                if item is STOP:
                    stopping = True
                    break
                batch.append(item)
                if len(batch) >= BATCH or self.queue.empty():
                    break
                item = self.queue.get_nowait()
            if batch:
                await self._write(batch)
            self._wake_flushes()
        for _, waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _wake_flushes(self) -> None:
        still = []
        for target, waiter in self.waiters:
            if self.written >= target:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                still.append((target, waiter))
        self.waiters = still
        if still:  # more to write for a flush: no linger before the next batch
            self.hurry.set()
        else:
            self.hurry.clear()

    async def _write(self, batch: list[dict]) -> None:
        try:
            for attempt in range(5):
                try:
                    await asyncio.to_thread(self.store.write_usage, batch)
                    return
                except Exception:  # the store is down: keep the batch and try again
                    log.exception("writing %d usage records failed (attempt %d)", len(batch), attempt + 1)
                    await asyncio.sleep(0.5 * (attempt + 1))
            log.error("dropped %d usage records after 5 attempts", len(batch))
        finally:
            self.written += len(batch)

    async def close(self) -> None:
        """Write everything queued before the stop marker, then stop."""
        if self.task is not None:
            self.queue.put_nowait(STOP)
            self.hurry.set()  # no linger before the last batch
            await self.task
