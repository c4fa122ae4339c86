"""Usage (billing) records written off the request path: the handler puts one record on a queue and a
background task writes batches to the store, one transaction per half second at most (a store commit
per request costs more CPU than the rest of a request). `flush()` writes what is queued at once (the
admin usage report calls it, so a report shows every request answered before it).

Nothing admitted is lost, whatever the store does: a batch the store refuses is spilled to a file in
the spill folder (so memory holds at most what arrives between two writes), and the spilled files are
replayed, oldest first, once the store answers again, after a growing pause between tries; a stop
writes or spills everything queued, and the next start replays what is left. A replay skips records
the store already holds (a write that landed but whose answer was lost), so none is counted twice."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
import uuid
from pathlib import Path

log = logging.getLogger("mlplane.gateway.usage")
BATCH = 500
LINGER_S = 0.5  # gather a batch: one store transaction per half second under load, not one per request
FLUSH_WAIT_S = 10.0  # the most a flush waits for a store that keeps failing
RETRY_S = (0.5, 1.0, 2.0, 5.0)  # pauses before the store is tried again after 1, 2, 3, 4+ failures
STOP = object()


class UsageWriter:
    def __init__(self, store, spill_dir: str | Path | None = None, clock=time.monotonic):
        self.store = store
        self.spill = Path(spill_dir) if spill_dir else Path(tempfile.mkdtemp(prefix="mlplane-usage-"))
        self.clock = clock  # injectable: a test plays a long outage without waiting it out
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.hurry = asyncio.Event()  # set by flush(): end the linger now
        self.queued = 0  # records put on the queue so far
        self.written = 0  # records handed to the store or spilled so far
        self.waiters: list[tuple[int, asyncio.Future]] = []  # flushes: (records they wait for, future)
        self.failures = 0  # store failures in a row
        self.retry_at = 0.0  # when the store may be tried again (clock)

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="usage-writer")

    def record(self, record: dict) -> None:
        self.queued += 1
        self.queue.put_nowait(record)

    def spilled(self) -> list[Path]:
        return sorted(self.spill.glob("*.jsonl")) if self.spill.exists() else []

    async def flush(self) -> None:
        """Waits until every record queued before the call is written or spilled (at most FLUSH_WAIT_S)."""
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
        await self._replay()  # what an earlier process left
        stopping = False
        while not stopping:
            item = await self._next()
            if item is None:  # nothing new: a moment to replay
                await self._replay()
                continue
            batch, stopping = await self._gather(item)
            if batch:
                await self._write(batch)
            self._wake_flushes()
        for _, waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _next(self):
        """The next record, or None when spilled files wait and the store may be tried again first."""
        if not self.spilled():
            return await self.queue.get()
        pause = max(self.retry_at - self.clock(), 0.0)
        try:
            return await asyncio.wait_for(self.queue.get(), pause) if pause else self.queue.get_nowait()
        except (TimeoutError, asyncio.QueueEmpty):
            return None

    async def _gather(self, item) -> tuple[list[dict], bool]:
        """A batch starting with `item` after the linger; True when the stop marker was met."""
        if item is not STOP and not self.hurry.is_set():
            try:
                await asyncio.wait_for(self.hurry.wait(), LINGER_S)
            except TimeoutError:
                pass
        self.hurry.clear()
        batch: list[dict] = []
        while True:
            if item is STOP:
                return batch, True
            batch.append(item)
            if len(batch) >= BATCH or self.queue.empty():
                return batch, False
            item = self.queue.get_nowait()

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
        """To the store when it may be tried, after the older spilled records; else to a spill file."""
        try:
            if self.clock() >= self.retry_at:
                await self._replay()
                if not self.spilled() and await self._try(self.store.write_usage, batch):
                    return
            self._spill(batch)
        finally:
            self.written += len(batch)

    async def _replay(self) -> None:
        """Spilled files into the store, oldest first, while it answers."""
        for path in self.spilled():
            if self.clock() < self.retry_at:
                return
            claimed = path.with_suffix(f".replaying-{os.getpid()}")
            try:
                path.rename(claimed)  # another worker sharing the folder leaves a claimed file alone
            except FileNotFoundError:
                continue
            records = [json.loads(line) for line in claimed.read_text().splitlines() if line]
            if not await self._try(self.store.write_usage, records, skip_existing=True):
                claimed.rename(path)
                return
            claimed.unlink()
            log.info("replayed %d spilled usage records from %s", len(records), path.name)

    async def _try(self, write, records: list[dict], **options) -> bool:
        try:
            await asyncio.to_thread(write, records, **options)
        except Exception:  # the store is down: the caller keeps the records on disk
            self.failures += 1
            self.retry_at = self.clock() + RETRY_S[min(self.failures, len(RETRY_S)) - 1]
            log.exception("writing %d usage records failed (%d in a row)", len(records), self.failures)
            return False
        self.failures = 0
        return True

    def _spill(self, batch: list[dict]) -> None:
        self.spill.mkdir(parents=True, exist_ok=True)
        # names sort in spill order: a clock-independent counter of nanoseconds, then a unique part
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        staged = self.spill / f"{name}.part"
        staged.write_text("".join(json.dumps(record) + "\n" for record in batch))
        staged.rename(self.spill / f"{name}.jsonl")  # whole or absent: a reader never meets half a file

    async def close(self) -> None:
        """Write or spill everything queued before the stop marker, then stop."""
        if self.task is not None:
            self.queue.put_nowait(STOP)
            self.hurry.set()  # no linger before the last batch
            await self.task
