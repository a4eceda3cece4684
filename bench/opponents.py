"""Which buyers make a stalling seller pay: every buyer family against a ladder of rule sellers.

Plays each buyer (the stall-punishing families, the default training pool's families, and for reference the
held-out ``walker`` and ``picky``) against four rule sellers that stall less and less (hardliner, boulware, linear,
conceder) on the first N scenarios of the *training* split (half opened by the buyer), one negotiation per
scenario and pair, through the Marketplace. A spec with ``key=a..b`` ranges draws its parameters per negotiation,
as a training pool does. Prints, per buyer and seller, the deal rate, the share of negotiations the buyer walked
away from, and the mean seller utility (its reservation value without a deal); the last column is the seller's
utility as boulware minus as linear: negative means holding out costs the seller against that buyer.

    python bench/opponents.py -n 200
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from nego.agents.registry import resolve
from nego.market.marketplace import Job, run_jobs
from nego.market.rates import deal_rate_of
from nego.market.types import EndReason, NegotiationResult
from nego.scenarios.scenario import Role
from nego.training.config import DEFAULT_TRAIN_BUYERS
from nego.training.pool import BuyerPool
from nego.training.rollout import split_scenarios

SELLERS = ("hardliner", "boulware", "linear", "conceder")
NEW = ("reciprocal", "outside", "hazard", "deadline")
POOL_DRAWN = (
    "reciprocal:r=0.5..1.5,harden=0..0.5",
    "outside:low=0.05..0.3,high=0.3..0.6,e=0.5..2",
    "hazard:quit=0.15..0.5,expect=0.01..0.05,e=0.5..2",
    "deadline:early=0.3..0.6,e=1..3",
)
HELD_OUT = ("walker", "picky")


def row(results: list[NegotiationResult]) -> tuple[float, float, float]:
    """(deal rate per negotiation, buyer walk-away rate, mean seller utility)."""
    deals = deal_rate_of(r.outcome for r in results) or 0.0
    walks = np.mean([r.outcome.end_reason is EndReason.WALK_AWAY and r.outcome.ended_by is Role.BUYER for r in results])
    return deals, float(walks), float(np.mean([r.outcome.seller_utility for r in results]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="training-split scenarios (one negotiation per pair)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the parameter draws and negotiation seeds")
    args = parser.parse_args()
    scenarios = split_scenarios("train", args.n)
    groups = [
        ("stall-punishing families, defaults", NEW),
        ("stall-punishing families, parameters drawn per negotiation", POOL_DRAWN),
        ("default training pool (training/config.DEFAULT_TRAIN_BUYERS)", tuple(dict.fromkeys(DEFAULT_TRAIN_BUYERS))),
        ("held-out evaluation buyers, for reference only", HELD_OUT),
    ]
    start = time.process_time()
    played = 0
    header = f"{'buyer':<52}" + "".join(f"{s:>20}" for s in SELLERS) + f"{'boul-lin':>10}"
    print(f"{args.n} training-split scenarios, one negotiation per scenario and pair; cell: deal / walk / utility")
    for title, buyers in groups:
        print(f"\n## {title}\n{header}")
        for b, buyer in enumerate(buyers):
            pool = BuyerPool((buyer,))
            pool.check()
            utility = {}
            cells = []
            for seller in SELLERS:
                rng = np.random.default_rng([args.seed, b])  # the same draws for every seller: paired cells
                jobs = [
                    Job(sc, seller, pool.draw(rng), seed=args.seed * 1_000_003 + i) for i, sc in enumerate(scenarios)
                ]
                deals, walks, u = row(run_jobs(resolve, jobs))
                played += len(jobs)
                utility[seller] = u
                cells.append(f"{deals:5.2f} /{walks:5.2f} /{u:6.3f}")
            print(
                f"{buyer:<52}"
                + "".join(f"{c:>20}" for c in cells)
                + f"{utility['boulware'] - utility['linear']:>+10.3f}"
            )
    print(f"\n{played} negotiations in {time.process_time() - start:.1f} CPU s")


if __name__ == "__main__":
    main()
