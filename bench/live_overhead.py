"""Does the live view slow the market? Same simulation with and without the rich live view, in one run.

Run: .venv/bin/python bench/live_overhead.py [--days 4 --negotiations 250 --repeats 3]
Prints CPU seconds per negotiation for both and their ratio (1.00 = no cost). The view renders into a
discarded terminal at its normal refresh rate, so the cost of building and drawing the tables is counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from nego.cli.simulate_cmd import ConsoleView
from nego.simulation import SimulateConfig, run_simulation
from rich.console import Console


def one(live: bool, days: int, negotiations: int, seed: int) -> float:
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as sink:
        console = Console(file=sink, force_terminal=live, width=140)
        cfg = SimulateConfig(days=days, negotiations=negotiations, seed=seed, out=Path(tmp) / "run")
        start = time.process_time()
        result = run_simulation(cfg, observer=ConsoleView(console, live=live))
        spent = time.process_time() - start
    return spent / result.negotiations.height


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--negotiations", type=int, default=250)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    one(False, 1, 10, 99)  # warm imports and caches
    plain, live = [], []
    for r in range(args.repeats):  # interleaved, so drifting machine load hits both alike
        plain.append(one(False, args.days, args.negotiations, r))
        live.append(one(True, args.days, args.negotiations, r))
    p, v = statistics.median(plain), statistics.median(live)
    n = args.days * args.negotiations
    print(f"workload: {n} negotiations per run, {args.repeats} runs each, median CPU ms per negotiation")
    print(f"without live view: {p * 1e3:.3f} ms")
    print(f"with live view:    {v * 1e3:.3f} ms")
    print(f"ratio live/plain:  {v / p:.3f}")


if __name__ == "__main__":
    main()
