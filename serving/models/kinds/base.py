"""What every served model is (tensor specs in and out, `infer`), and the dynamic batcher that joins
concurrent requests to one encoder call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from starlette.concurrency import run_in_threadpool

from serving.models.protocols.protocol import TensorSpec


class ServedModel:
    """A loaded model version behind the protocol. Subclasses set `inputs`, `outputs`, `platform`."""

    platform = "python"
    log_inputs = False  # the version's card (registry tag mlplane.log_inputs=true) lets its inputs be logged
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []

    def parameters(self) -> dict:
        return {}

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict) -> dict[str, np.ndarray]:
        raise NotImplementedError

    async def infer_async(self, inputs: dict[str, np.ndarray], parameters: dict) -> dict[str, np.ndarray]:
        """Off the event loop (torch releases the GIL), so other requests keep being read."""
        return await run_in_threadpool(self.infer, inputs, parameters)

    def close(self) -> None:
        """Release what the version holds (batcher tasks); requests already admitted have finished."""


@dataclass
class _Pending:
    rows: np.ndarray
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


class DynamicBatcher:
    """Requests queue up; one worker takes the first, waits up to `max_delay_ms` for more (up to
    `max_batch` rows), runs `run(batch)` once in a thread and hands each request its rows back.
    `on_batch(rows)` observes batch sizes (metrics)."""

    def __init__(
        self,
        run: Callable[[np.ndarray], np.ndarray],
        max_batch: int,
        max_delay_ms: float,
        on_batch: Callable[[int], None] | None = None,
    ):
        self.run = run
        self.max_batch = max_batch
        self.max_delay = max_delay_ms / 1000
        self.on_batch = on_batch or (lambda rows: None)
        self._queue: asyncio.Queue[_Pending | None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def submit(self, rows: np.ndarray) -> np.ndarray:
        if self._closed:  # a request that took this version just before it was replaced still gets served
            self.on_batch(len(rows))
            return await run_in_threadpool(self.run, rows)
        if self._queue is None:  # created on the serving loop, at first use
            self._queue = asyncio.Queue()
            self._loop = asyncio.get_running_loop()
            self._loop.create_task(self._work())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(rows, future))
        return await future

    async def _work(self) -> None:
        queue = self._queue
        stopping = False
        while not stopping:
            first = await queue.get()
            if first is None:
                break
            batch, size = [first], len(first.rows)
            deadline = first.queued_at + self.max_delay
            while size < self.max_batch:
                timeout = deadline - time.perf_counter()
                try:
                    item = queue.get_nowait() if timeout <= 0 else await asyncio.wait_for(queue.get(), timeout)
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                if item is None:  # closed: serve what is queued, then stop
                    stopping = True
                    continue
                batch.append(item)
                size += len(item.rows)
            await self._run(batch, size)

    async def _run(self, batch: list[_Pending], size: int) -> None:
        self.on_batch(size)
        try:
            rows = np.concatenate([p.rows for p in batch]) if len(batch) > 1 else batch[0].rows
            result = await run_in_threadpool(self.run, rows)
        except Exception as error:  # every waiting request learns of it
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error)
            return
        start = 0
        for pending in batch:
            end = start + len(pending.rows)
            if not pending.future.done():
                pending.future.set_result(result[start:end])
            start = end

    def close(self) -> None:
        """Stop after the queued requests (callable from any thread)."""
        self._closed = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
