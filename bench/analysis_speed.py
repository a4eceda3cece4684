"""How fast is the exact scenario analysis? Vectorised `analyse` vs a plain-Python pass over the same outcomes.

Run: .venv/bin/python bench/analysis_speed.py [--n 1000 --peer 50]
Generates n scenarios and analyses all of them (Pareto frontier, Nash point, ZOPA, opposition), then times a
plain-Python peer (per-outcome utilities via Preferences.utility, Pareto by sort and running max, Nash by scan)
on the first `--peer` of them, checks both find the same frontier size and Nash product, and prints the ratio.
"""

from __future__ import annotations

import argparse
import itertools
import time

from nego.scenarios.analysis import analyse
from nego.scenarios.generator import generate_scenarios


def plain_python(scenario) -> tuple[int, float]:
    names = [i.name for i in scenario.issues]
    points = []
    for values in itertools.product(*(i.grid() for i in scenario.issues)):
        offer = dict(zip(names, values, strict=True))
        points.append((scenario.seller.utility(offer, scenario.issues), scenario.buyer.utility(offer, scenario.issues)))
    points.sort(key=lambda p: (-p[0], -p[1]))
    frontier, best_b = [], -1.0
    for us, ub in points:
        if ub > best_b:
            frontier.append((us, ub))
            best_b = ub
    rv_s, rv_b = scenario.seller.reservation, scenario.buyer.reservation
    nash = max(((us - rv_s) * (ub - rv_b) for us, ub in points if us >= rv_s and ub >= rv_b), default=0.0)
    return len(frontier), nash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--peer", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.process_time()
    scenarios = generate_scenarios(args.n, args.seed)
    t1 = time.process_time()
    results = [analyse(s) for s in scenarios]
    t2 = time.process_time()
    subset = scenarios[: args.peer]
    t3 = time.process_time()
    peer = [plain_python(s) for s in subset]
    t4 = time.process_time()
    fast_subset = time.process_time()
    for s in subset:
        analyse(s)
    fast_subset = time.process_time() - fast_subset
    agree = sum(abs(r.nash_product - nash) < 1e-9 for r, (_, nash) in zip(results, peer, strict=False))
    outcomes = sum(s.outcome_count for s in scenarios)
    print(f"{args.n} generated scenarios, {outcomes:,} outcomes in all (mean {outcomes / args.n:,.0f})")
    print(f"generate: {t1 - t0:.2f} CPU s; analyse all: {t2 - t1:.2f} CPU s ({(t2 - t1) / args.n * 1e3:.2f} ms each)")
    print(f"peer (plain Python) on {args.peer}: {t4 - t3:.2f} CPU s; vectorised on the same: {fast_subset:.3f} CPU s")
    ratio = (t4 - t3) / max(fast_subset, 1e-9)
    print(f"ratio plain/vectorised: {ratio:.0f}x; same Nash product on {agree}/{args.peer}")


if __name__ == "__main__":
    main()
