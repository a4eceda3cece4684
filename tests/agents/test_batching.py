"""The one batcher of in-process generation: time-windowed for chat backends, loop-quiet for the compact model."""

from __future__ import annotations

import asyncio
import time

import pytest
from nego.agents.batching import Batcher


def _recording(batches: list[list[int]], *, slow_s: float = 0.0):
    def run(items: list[int]) -> list[int]:
        batches.append(list(items))
        time.sleep(slow_s)
        return [i * 10 for i in items]

    return run


async def test_a_quiet_batch_holds_everyone_about_to_ask_however_slow_the_clock():
    batches: list[list[int]] = []
    batcher = Batcher(
        _recording(batches, slow_s=0.05), max_batch=100, window_s=None, failure=lambda e: e, in_thread=False
    )

    async def ask(i: int, passes: int) -> int:
        for _ in range(passes):
            await asyncio.sleep(0)
        result, _ = await batcher.submit(i)
        return result

    # askers one and two loop passes late still join; one that arrives after the loop has been quiet does not
    results = await asyncio.gather(ask(0, 0), ask(1, 1), ask(2, 2), ask(3, 12))
    assert results == [0, 10, 20, 30]
    assert batches == [[0, 1, 2], [3]] and batcher.batches == 2


async def test_a_quiet_batch_respects_max_batch_and_fails_only_its_own_items():
    calls: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        calls.append(list(items))
        if 0 in items:
            raise RuntimeError("boom")
        return items

    batcher = Batcher(run, max_batch=2, window_s=None, failure=lambda e: e, in_thread=False)
    out = await asyncio.gather(*(batcher.submit(i) for i in range(5)), return_exceptions=True)
    assert calls == [[0, 1], [2, 3], [4]]
    assert [type(o) for o in out[:2]] == [RuntimeError, RuntimeError] and [o[0] for o in out[2:]] == [2, 3, 4]


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError, match="window_s"):
        Batcher(lambda items: items, max_batch=1, window_s=-1.0, failure=lambda e: e)
