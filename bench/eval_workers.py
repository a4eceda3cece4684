"""An evaluation on two worker processes against the same evaluation in one.

Runs ``nego eval``'s ``evaluate`` on a frozen suite (``--suite``, eval-1152 by default) for rule-based sellers
(``--sellers``; no reference sellers unless ``--baselines default``, so the arms are all that is played) at
``--workers 1`` and ``--workers 2``, arms alternating, each run in a fresh process into a fresh directory. Prints
each run's wall seconds split into playing the negotiations and the rest (their metrics, of which the optimality gaps
probe every negotiation with a rule buyer many times), the best and median of each arm, their ratio, and
whether both arms wrote the same metrics (timing columns aside).

    python bench/eval_workers.py                       # tft and linear on eval-1152, 3 runs per arm
    python bench/eval_workers.py --sellers boulware --runs 2
    python bench/eval_workers.py --sellers tft --baselines default --runs 1   # nego eval's default reference block
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(sellers: tuple[str, ...], suite: str, baselines: str, workers: int, out: Path) -> dict:
    """One evaluation in this process: how long its play and its metrics took."""
    from nego.evaluation import runner
    from nego.evaluation.config import EvalConfig

    played_at = []
    real_summarize = runner.summarize

    def summarize(*args, **kwargs):
        played_at.append(time.perf_counter())
        return real_summarize(*args, **kwargs)

    runner.summarize = summarize  # the run's metrics start where its play ends
    config = EvalConfig(sellers=sellers, suite=suite, baselines=baselines, workers=workers, out=out)
    start = time.perf_counter()
    result = runner.evaluate(config)
    end = time.perf_counter()
    return {
        "workers": workers,
        "negotiations": result.metrics.height,
        "wall_s": end - start,
        "play_s": played_at[0] - start,
        "metrics_s": end - played_at[0],
    }


def same_metrics(a: Path, b: Path) -> bool:
    import polars as pl
    from nego.market.transcript_rows import TIMING_COLUMNS

    x, y = (pl.read_parquet(d / "metrics.parquet") for d in (a, b))
    timing = [c for c in TIMING_COLUMNS if c in x.columns]
    return x.drop(timing).equals(y.drop(timing))


def child(args: argparse.Namespace, workers: int, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", str(workers), "--out", str(out)]
    cmd += ["--sellers", args.sellers, "--suite", args.suite, "--baselines", args.baselines]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NEGO_HOME": str(out.parent / "home")}
    line = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
    return json.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sellers", default="tft,linear")
    parser.add_argument("--suite", default="eval-1152")
    parser.add_argument("--baselines", default="none", help="as nego eval --baselines (default: none)")
    parser.add_argument("--runs", type=int, default=3, help="runs per arm")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sellers = tuple(s for s in args.sellers.split(",") if s)
    if args.child is not None:
        print(json.dumps(one_run(sellers, args.suite, args.baselines, args.child, args.out)))
        return
    cpus = len(os.sched_getaffinity(0))
    print(f"machine: {platform.machine()}, {cpus} usable CPUs, python {platform.python_version()}")
    print(f"workload: nego eval --sellers {args.sellers} --suite {args.suite} --baselines {args.baselines}")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        order = [1, 2] * args.runs
        for k, workers in enumerate(order):
            if k % 4 >= 2:  # alternate which arm goes first: 1 2 2 1 1 2 ...
                workers = 3 - workers
            out = Path(tmp) / f"run{k}" / "eval"
            runs.append(child(args, workers, out) | {"out": str(out)})
            r = runs[-1]
            print(
                f"{k + 1:>3} workers {r['workers']}: {r['negotiations']} negotiations, wall {r['wall_s']:.2f} s "
                f"(play {r['play_s']:.2f} s, metrics {r['metrics_s']:.2f} s)",
                flush=True,
            )
        first = {w: next(Path(r["out"]) for r in runs if r["workers"] == w) for w in (1, 2)}
        same = same_metrics(first[1], first[2])
    walls = {w: [r["wall_s"] for r in runs if r["workers"] == w] for w in (1, 2)}
    for w, values in walls.items():
        print(f"workers {w}: best {min(values):.2f} s, median {statistics.median(values):.2f} s")
    print(
        f"ratio 1 worker / 2 (evaluations per wall-second, 2 against 1): best {min(walls[1]) / min(walls[2]):.2f}x, "
        f"median {statistics.median(walls[1]) / statistics.median(walls[2]):.2f}x"
    )
    for part in ("play_s", "metrics_s"):
        one = statistics.median(r[part] for r in runs if r["workers"] == 1)
        two = statistics.median(r[part] for r in runs if r["workers"] == 2)
        print(f"  {part[:-2]}: median {one:.2f} s at 1 worker, {two:.2f} s at 2 ({one / two:.2f}x)")
    print(f"metrics identical across arms: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
