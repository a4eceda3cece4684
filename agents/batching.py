"""Collecting concurrent requests into batches for one model: what the in-process chat backend, the compact tiny
model and training's vLLM generation share.

Every negotiation that waits on the model puts its item in a queue; a batcher task takes up to ``max_batch`` waiting
items, runs them in one call, and hands each item its own result. It waits for more to arrive in one of two ways:
at most ``window_s`` seconds, or (``window_s=None``) until a few passes of the event loop bring no new item, so a
batch holds every negotiation that was about to ask, whatever the clock says. The call runs in a worker thread (so
the event loop keeps serving the market meanwhile) unless ``in_thread`` is False. The task ends once the queue is
empty and starts again with the next item, so a batcher that is no longer used holds nothing alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

QUIET_PASSES = 3
"""Event-loop passes without a new item after which a quiet-gathered batch closes."""
Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Pending(Generic[Item, Result]):
    item: Item
    future: asyncio.Future[Result]
    queued_at: float = field(default_factory=time.perf_counter)


class Batcher(Generic[Item, Result]):
    """Runs ``run(items) -> results`` (one result or exception per item, in order) on batches of submitted items.

    An exception raised by ``run`` itself fails every item of that batch with ``failure(exception)``; the batcher
    goes on with the next batch."""

    def __init__(
        self,
        run: Callable[[list[Item]], Sequence[Result | BaseException]],
        *,
        max_batch: int,
        window_s: float | None,
        failure: Callable[[BaseException], BaseException],
        in_thread: bool = True,
        name: str = "batcher",
    ) -> None:
        if max_batch < 1 or (window_s is not None and window_s < 0):
            raise ValueError(f"max_batch must be >= 1 and window_s >= 0; got {max_batch}, {window_s}")
        self.run, self.max_batch, self.window_s = run, max_batch, window_s
        self.failure, self.in_thread, self.name = failure, in_thread, name
        self._queue: asyncio.Queue[_Pending[Item, Result]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batches = 0
        """Batches run so far."""

    async def submit(self, item: Item) -> tuple[Result, float]:
        """The result of ``item`` and the seconds it waited in the queue and ran."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._queue is None:
            # queues and tasks belong to one event loop; a new loop (a new asyncio.run) gets its own
            self._loop, self._queue, self._task = loop, asyncio.Queue(), None
        pending: _Pending[Item, Result] = _Pending(item, loop.create_future())
        self._queue.put_nowait(pending)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain(self._queue), name=self.name)
        result = await pending.future
        return result, time.perf_counter() - pending.queued_at

    async def aclose(self, error: BaseException) -> None:
        """Stop the batcher; every item still waiting fails with ``error``."""
        if self._task is not None and self._loop is asyncio.get_running_loop():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._queue is not None and not self._queue.empty():
            waiting = self._queue.get_nowait()
            if not waiting.future.done():
                waiting.future.set_exception(error)
        self._task = self._queue = self._loop = None

    async def _gather(self, queue: asyncio.Queue[_Pending[Item, Result]]) -> list[_Pending[Item, Result]]:
        """The next batch: waiting up to ``window_s`` seconds for items, or until the event loop is quiet."""
        if self.window_s is None:
            seen = -1
            while seen != queue.qsize():
                seen = queue.qsize()
                for _ in range(QUIET_PASSES):
                    await asyncio.sleep(0)
            return [queue.get_nowait() for _ in range(min(seen, self.max_batch))]
        batch = [queue.get_nowait()]
        deadline = time.perf_counter() + self.window_s
        while len(batch) < self.max_batch:
            if queue.empty():
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    batch.append(await asyncio.wait_for(queue.get(), left))
                continue
            batch.append(queue.get_nowait())
        return batch

    async def _drain(self, queue: asyncio.Queue[_Pending[Item, Result]]) -> None:
        while not queue.empty():
            batch = await self._gather(queue)
            live = [p for p in batch if not p.future.done()]
            if not live:
                continue
            items = [p.item for p in live]
            self.batches += 1
            try:
                results = await asyncio.to_thread(self.run, items) if self.in_thread else self.run(items)
            except Exception as e:  # one failing batch fails its items, never the batcher
                results = [self.failure(e)] * len(live)
            for p, result in zip(live, results, strict=True):
                if p.future.done():
                    continue
                if isinstance(result, BaseException):
                    p.future.set_exception(result)
                else:
                    p.future.set_result(result)
