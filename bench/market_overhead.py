"""What the marketplace costs on top of the bare protocol.

Plays the same N negotiations (generated scenarios, a Boulware seller against a Conceder buyer, both rule-based)
four ways on one event loop and prints CPU times of this process (best of ``--repeat``; CPU time rather than
wall time because the bench is CPU-bound and wall time is noisy on a shared machine) and ratios to the bare run:

- bare: ``asyncio.gather`` of ``run_negotiation`` with agents built from the same child seeds;
- market: ``Marketplace.run`` (semaphores, ids, result ordering);
- market+events: the same with an ``EventBus`` feeding ``RunningStats`` and a turn counter;
- market+transcripts: the same writing Parquet parts (``flush_every=256``) to a temporary directory.

    python bench/market_overhead.py -n 2000
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from nego.agents.registry import resolve
from nego.market.events import EventBus, TurnPlayed
from nego.market.marketplace import Job, Marketplace, child_seeds
from nego.market.protocol import run_negotiation
from nego.market.summary import RunningStats
from nego.market.transcripts import TranscriptWriter
from nego.scenarios.generator import generate_scenario
from nego.scenarios.scenario import Role

SELLER, BUYER = "boulware", "conceder"


async def bare(jobs: list[Job], factories: dict) -> None:
    async def one(job: Job):
        s, b = child_seeds(job.seed)
        seller, buyer = factories[job.seller](Role.SELLER, s), factories[job.buyer](Role.BUYER, b)
        return await run_negotiation(job.scenario, seller, buyer, seed=job.seed)

    await asyncio.gather(*(one(j) for j in jobs))


async def market(jobs: list[Job], factories: dict, mode: str) -> None:
    bus, writer, tmp = None, None, None
    if mode == "events":
        bus = EventBus()
        bus.subscribe(RunningStats())
        turns = [0]
        bus.subscribe(lambda e: turns.__setitem__(0, turns[0] + 1) if isinstance(e, TurnPlayed) else None)
    if mode == "transcripts":
        tmp = tempfile.TemporaryDirectory()
        writer = TranscriptWriter(tmp.name, flush_every=256)
    await Marketplace(factories, bus=bus, writer=writer).run(jobs)
    if tmp is not None:
        tmp.cleanup()


def best_of(repeat: int, make) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        asyncio.run(make())
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="negotiations per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant; the best time is reported")
    args = parser.parse_args()
    factories = {SELLER: resolve(SELLER), BUYER: resolve(BUYER)}
    scenarios = [generate_scenario(0, index=i) for i in range(50)]
    jobs = [Job(scenarios[i % len(scenarios)], SELLER, BUYER, seed=i) for i in range(args.n)]
    base = best_of(args.repeat, lambda: bare(jobs, factories))
    print(f"{args.n} negotiations, best of {args.repeat}")
    print(f"{'bare gather':<22}{base:8.3f} s  {args.n / base:8.0f} neg/s  ratio 1.00")
    for mode in ("plain", "events", "transcripts"):
        t = best_of(args.repeat, lambda mode=mode: market(jobs, factories, mode))
        label = "market" if mode == "plain" else f"market+{mode}"
        print(f"{label:<22}{t:8.3f} s  {args.n / t:8.0f} neg/s  ratio {t / base:.2f}")


if __name__ == "__main__":
    main()
