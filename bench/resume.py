"""What resuming a finished simulation costs, against the run that wrote it.

Runs a population simulation (rule-based sellers and buyers, generated scenarios, ``--days`` market days of
``--negotiations`` pairs, stock and demand large enough that every pair trades every day) into a fresh
directory, then the very same configuration again on that directory, in this process, and prints both wall and
CPU times and the resume / run ratios. A finished run resumed plays nothing; the script checks that the resumed
run played no negotiation and settled every day exactly as the first.

    python bench/resume.py                      # 30 days x 200 pairs = 6,000 negotiations
    python bench/resume.py --days 10 --negotiations 50
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from nego.cli.simulate_cmd import ConsoleView
from nego.market.transcripts import read_negotiations
from nego.simulation import SimulateConfig, run_simulation
from rich.console import Console


def timed(cfg: SimulateConfig):
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_simulation(cfg, observer=ConsoleView(Console(quiet=True)))  # as the command watches it
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--negotiations", type=int, default=200, help="pairs a day")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = SimulateConfig(
            days=args.days,
            negotiations=args.negotiations,
            inventory=10**9,
            demand=10**9,
            seed=args.seed,
            out=Path(tmp) / "run",
        )
        first, run_wall, run_cpu = timed(cfg)
        parts = len(list((cfg.out_dir / "negotiations").glob("part-*.parquet")))
        rows = read_negotiations(cfg.out_dir).height
        again, resume_wall, resume_cpu = timed(cfg)
        played_again = read_negotiations(cfg.out_dir).height - rows
    print(f"machine: {platform.machine()}, {len(os.sched_getaffinity(0))} usable CPUs")
    print(
        f"{args.days} days x {args.negotiations} pairs: {first.negotiations.height} negotiations "
        f"in {parts} transcript parts"
    )
    print(f"{'run':<10}{run_wall:8.2f} s wall {run_cpu:8.2f} s CPU")
    print(f"{'resume':<10}{resume_wall:8.2f} s wall {resume_cpu:8.2f} s CPU")
    print(f"resume / run: {resume_wall / run_wall:.3f} wall, {resume_cpu / run_cpu:.3f} CPU")
    print(
        f"resumed run: {again.skipped} negotiations complete on disk, {played_again} played again; "
        f"days settled identically: {first.days.equals(again.days)}"
    )


if __name__ == "__main__":
    main()
