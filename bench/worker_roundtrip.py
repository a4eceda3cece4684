"""What a negotiation's trip through a worker process costs, against generating its scenario and playing it.

With ``--workers N`` a result comes back packed (``nego.market.packing``). A generated scenario of a simulation is
made by the worker that plays it (a ``Draft``) and comes to the parent once, with the result; a job that carries its
scenario (a scenario list, an evaluation) sends it from the parent to the worker. This plays N negotiations
(generated scenarios, a Boulware seller against a Conceder buyer, rule-based) and times, arms in turns, best of
``--repeat`` (CPU time of this process):

- generate: making the N scenarios (``generate_scenario``); play: ``Marketplace.run`` of the N jobs;
- a draft's scenario: pickling and unpickling each scenario once (worker -> parent);
- a job's scenario, as before drafts: each scenario worker -> parent, then inside its job back to a worker;
- result: ``pack_result`` and ``pickle.dumps`` (the worker's side), ``pickle.loads`` and ``unpack_result`` (the
  parent's side).

The pickling arms run with the cyclic collector paused, as the pool's own pickling does (``nego.market.workers``);
play paces it as every market run does.

Printed per negotiation, and each trip (a draft's, a job's) as a share of generate + play.

    python bench/worker_roundtrip.py -n 2000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import pickle
import time
from collections.abc import Callable

from nego.agents.registry import resolve
from nego.market.marketplace import Job, Marketplace
from nego.market.packing import pack_result, unpack_result
from nego.scenarios.generator import generate_scenario

SELLER, BUYER = "boulware", "conceder"
PROTOCOL = pickle.HIGHEST_PROTOCOL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="negotiations")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each arm, in turns; the best is reported")
    args = parser.parse_args()
    factories = {SELLER: resolve(SELLER), BUYER: resolve(BUYER)}
    scenarios = [generate_scenario(i) for i in range(args.n)]
    for scenario in scenarios:
        scenario.content_hash()  # as a worker leaves it: the hash travels with the scenario
    jobs = [Job(sc, SELLER, BUYER, seed=i) for i, sc in enumerate(scenarios)]
    results = asyncio.run(Marketplace(factories).run(jobs))
    packed = [pack_result(r) for r in results]
    blob = pickle.dumps(packed, protocol=PROTOCOL)

    def scenario_trip() -> None:
        back = pickle.loads(pickle.dumps(scenarios, protocol=PROTOCOL))
        pickle.loads(pickle.dumps([Job(sc, SELLER, BUYER, seed=i) for i, sc in enumerate(back)], protocol=PROTOCOL))

    arms: dict[str, Callable[[], object]] = {
        "generate": lambda: [generate_scenario(i) for i in range(args.n)],
        "play": lambda: asyncio.run(Marketplace(factories).run(jobs)),
        "a draft's scenario": lambda: pickle.loads(pickle.dumps(scenarios, protocol=PROTOCOL)),
        "a job's scenario": scenario_trip,
        "result: pack + dumps": lambda: pickle.dumps([pack_result(r) for r in results], protocol=PROTOCOL),
        "result: loads + unpack": lambda: [unpack_result(p) for p in pickle.loads(blob)],
    }
    best = dict.fromkeys(arms, float("inf"))
    for _ in range(args.repeat):
        for name, arm in arms.items():
            paused = name not in ("generate", "play")
            if paused:
                gc.disable()
            start = time.process_time()
            arm()
            best[name] = min(best[name], time.process_time() - start)
            gc.enable()
    turns = sum(len(r.turns) for r in results) / len(results)
    print(f"{args.n} negotiations ({turns:.1f} turns each), best of {args.repeat}, CPU us per negotiation")
    for name, seconds in best.items():
        print(f"{name:<26}{seconds / args.n * 1e6:8.1f}")
    result = best["result: pack + dumps"] + best["result: loads + unpack"]
    work = best["generate"] + best["play"]
    for kind in ("draft", "job"):
        trip = result + best[f"a {kind}'s scenario"]
        print(f"a {kind}'s trip / (generate + play): {trip / work:.3f} ({trip / args.n * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
