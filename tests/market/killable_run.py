"""A marketplace run with transcripts, meant to be killed: ``python -m tests.market.killable_run DIR N FAIL [WORKERS]``.

Prints ``ready`` once imports are done, then plays N slow-ish jobs writing small parts and prints ``ended``
after each negotiation, so that a test can kill it at a random point of its progress. With FAIL=1 every seventh
job's seller cannot act (an error outcome), so a later run with FAIL=0 must play those again as a new attempt.
With WORKERS > 1 the jobs are played by that many worker processes, whose pids it prints (``workers PID ...``)
before its first ``ended``.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import sys

from nego.market.events import EventBus, NegotiationEnded
from nego.market.marketplace import Job, Marketplace
from nego.market.transcripts import TranscriptWriter
from nego.market.workers import WorkerPool

from ..conftest import make_widget_scenario
from .fakes import BrokenFactory, Factory


def make_jobs(n: int) -> list[Job]:
    sc = make_widget_scenario()
    return [Job(sc, "flaky" if i % 7 == 0 else "a", "b", seed=i, run_id="kill") for i in range(n)]


def main(directory: str, n: int, fail: bool, workers: int = 1) -> None:
    specs = {
        "flaky": BrokenFactory("flaky") if fail else Factory("flaky", delay=0.004),
        "a": Factory("a", delay=0.004),
        "b": Factory("b", delay=0.004),
    }
    bus = EventBus()
    shown = []

    def show(event: object) -> None:
        if isinstance(event, NegotiationEnded):
            if workers > 1 and not shown:
                shown.append(True)
                print("workers", *(p.pid for p in multiprocessing.active_children()))
            print("ended", flush=True)

    bus.subscribe(show)
    print("ready", flush=True)
    with WorkerPool(workers, specs) if workers > 1 else contextlib.nullcontext() as pool:
        writer = TranscriptWriter(directory, flush_every=2)
        market = Marketplace(specs, concurrency=4, bus=bus, writer=writer, pool=pool)
        asyncio.run(market.run(make_jobs(n)))
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]) if len(sys.argv) > 4 else 1)
