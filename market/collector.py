"""Cyclic garbage collection paced for a market run.

A market holds many negotiations in flight at once, each suspended across its awaits with its request, frames and
futures alive. CPython's collector runs its youngest generation every 700 net container allocations, so during a
run it keeps finding those in-flight objects alive, promotes them, and traverses them again one generation up: with
a thousand concurrent LLM negotiations that was about a third of the market's own CPU (ad hoc). Run less often, it
finds most of them already freed by reference counting. Cyclic garbage then waits for up to 50,000 allocations
instead of 700 before it is freed; what a run computes does not depend on when the collector runs.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

RUN_THRESHOLD = 50_000
"""Net container allocations between collections of the youngest generation during a run (CPython's default: 700)."""


@contextmanager
def paced_collection(threshold: int = RUN_THRESHOLD) -> Iterator[None]:
    """Raise the youngest generation's threshold to ``threshold`` for the duration, then restore it. Leaves a higher
    threshold, or a disabled collector, as it is (so a run inside a run changes nothing)."""
    before = gc.get_threshold()
    if not gc.isenabled() or before[0] == 0 or before[0] >= threshold:
        yield
        return
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
