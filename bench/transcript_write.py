"""What writing transcripts costs against playing the negotiations they record.

Plays N negotiations once (generated scenarios, a Boulware seller against a Conceder buyer, rule-based), then times,
in turns, playing them again (``Marketplace.run`` without a writer) and writing their results with a
``TranscriptWriter`` into a fresh directory (``add`` for each, parts of ``--flush-every`` rows, the merges of
compaction, the final flush). Prints the CPU time of each (best of ``--repeat``), per negotiation, and the ratio
write / play: the share of a rule-agent run that goes to its transcripts.

    python bench/transcript_write.py -n 4000 --repeat 7
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from nego.agents.registry import resolve
from nego.market.marketplace import Job, Marketplace
from nego.market.transcripts import TranscriptWriter
from nego.scenarios.generator import generate_scenario

SELLER, BUYER = "boulware", "conceder"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=4000, help="negotiations")
    parser.add_argument("--repeat", type=int, default=7, help="runs of each arm, alternating; the best is reported")
    parser.add_argument("--flush-every", type=int, default=256, help="rows per part")
    args = parser.parse_args()
    factories = {SELLER: resolve(SELLER), BUYER: resolve(BUYER)}
    scenarios = [generate_scenario(0, index=i) for i in range(50)]
    jobs = [Job(scenarios[i % len(scenarios)], SELLER, BUYER, seed=i) for i in range(args.n)]
    results = asyncio.run(Marketplace(factories).run(jobs))

    def play() -> None:
        asyncio.run(Marketplace(factories).run(jobs))

    def write() -> None:
        with tempfile.TemporaryDirectory() as directory:
            writer = TranscriptWriter(directory, flush_every=args.flush_every)
            for job, result in zip(jobs, results, strict=True):
                writer.add(job, 0, result, 0.0)
            writer.flush()

    times: dict[str, list[float]] = {"play": [], "write": []}
    for _ in range(args.repeat):
        for name, arm in (("play", play), ("write", write)):
            start = time.process_time()
            arm()
            times[name].append(time.process_time() - start)
    turns = sum(len(r.turns) for r in results) / len(results)
    print(f"{args.n} negotiations ({turns:.1f} turns each), parts of {args.flush_every}, best of {args.repeat}")
    for name, ts in times.items():
        print(f"{name:<6}{min(ts):8.3f} s  {min(ts) / args.n * 1e6:6.0f} us per negotiation")
    print(f"write / play: {min(times['write']) / min(times['play']):.2f}")


if __name__ == "__main__":
    main()
