"""Usage records written off the request path: the handler puts one record on a queue and a
background task writes batches to the store. Shutdown drains the queue, so a clean stop loses none."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("mlplane.gateway.usage")
BATCH = 500
LINGER_S = 0.05  # gather a batch: one store transaction per 50 ms under load, not one per request
STOP = object()


class UsageWriter:
    def __init__(self, store):
        self.store = store
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="usage-writer")

    def record(self, record: dict) -> None:
        self.queue.put_nowait(record)

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = []
            item = await self.queue.get()
            if item is not STOP:
                await asyncio.sleep(LINGER_S)
            while True:
                if item is STOP:
                    stopping = True
                    break
                batch.append(item)
                if len(batch) >= BATCH or self.queue.empty():
                    break
                item = self.queue.get_nowait()
            await self._write(batch)

    async def _write(self, batch: list[dict]) -> None:
        for attempt in range(5):
            try:
                await asyncio.to_thread(self.store.write_usage, batch)
                return
            except Exception:  # the store is down: keep the batch and try again
                log.exception("writing %d usage records failed (attempt %d)", len(batch), attempt + 1)
                await asyncio.sleep(0.5 * (attempt + 1))
        log.error("dropped %d usage records after 5 attempts", len(batch))

    async def close(self) -> None:
        """Write everything queued before the stop marker, then stop."""
        if self.task is not None:
            self.queue.put_nowait(STOP)
            await self.task
