"""A simulation on two worker processes against the same simulation in one.

Plays a fixed seeded population simulation (the default rule-based sellers and buyers, ``--days`` market days of
``--negotiations`` pairs, stock and demand large enough that every pair trades every day; scenarios generated,
or ``--scenarios`` as ``nego simulate`` takes it) at ``--workers 1`` and at ``--workers 2``, arms alternating,
each run in a fresh process into a fresh directory (so no run inherits another's caches or worker pool). Prints
negotiations per wall-second of each run (the whole ``run_simulation``: worker start-up, planning, playing,
writing), the best and median of each arm, their ratio, the CPU time of the run's parent process (and the part of it
the cyclic garbage collector took) and of its workers, the CPU time other processes took from the machine meanwhile,
and the load average around the runs (it counts the run's own processes): on a shared machine other jobs take cores
too. It checks that both arms wrote the same transcripts (timing columns aside).

A third arm gives the bound the two-worker run is read against: two single-process runs started together, each with
half the pairs a day, so the same number of negotiations with nothing shared (``--no-bound`` leaves it out). Its
ratio to one process is what the machine's cores give to this work split in two; the two-worker ratio can come close
to it only as far as splitting one run costs nothing.

    python bench/workers.py                           # 12 days x 1000 pairs, 3 runs per arm
    python bench/workers.py --scenarios builtin       # the builtin scenario list instead of generated ones
    python bench/workers.py --runs 5 --days 4
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(days: int, negotiations: int, scenarios: str | None, workers: int, out: Path) -> dict:
    """One simulation in this process; what it did and how long it took."""
    from nego.simulation import SimulateConfig, run_simulation

    cfg = SimulateConfig(
        days=days,
        negotiations=negotiations,
        inventory=10**9,
        demand=10**9,
        scenarios=scenarios,
        seed=0,
        out=out,
        workers=workers,
    )
    collector = CollectorTime()
    wall, cpu = time.perf_counter(), time.process_time()
    with collector:
        result = run_simulation(cfg)
    return {
        "workers": workers,
        "negotiations": result.negotiations.height,
        "wall_s": time.perf_counter() - wall,
        "parent_cpu_s": time.process_time() - cpu,
        "workers_cpu_s": workers_cpu(),
        "process_cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),  # imports and all
        "parent_gc_s": collector.seconds,
    }


class CollectorTime:
    """Wall seconds the cyclic garbage collector ran in this process while the block ran (its own callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def workers_cpu() -> float:
    """CPU seconds of the finished workers: the forkserver reaped them, so their times are its children's times."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # its own and its children's


def same_transcripts(a: Path, b: Path) -> bool:
    from nego.market.transcript_rows import TIMING_COLUMNS
    from nego.market.transcripts import read_negotiations, read_turns

    for read, keys in ((read_negotiations, ["negotiation_id"]), (read_turns, ["negotiation_id", "index"])):
        x, y = (read(d).drop(TIMING_COLUMNS, strict=False).sort(keys) for d in (a, b))
        if not x.equals(y):
            return False
    return True


def child(args: argparse.Namespace, workers: int, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", str(workers), "--days", str(args.days)]
    cmd += ["--negotiations", str(args.negotiations), "--out", str(out)]
    cmd += ["--scenarios", args.scenarios] if args.scenarios else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before, busy = os.getloadavg()[0], busy_s()
    line = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
    run = json.loads(line)
    others = busy_s() - busy - run["process_cpu_s"] - run["workers_cpu_s"]
    return run | {"load_before": before, "load_after": os.getloadavg()[0], "others_cpu_s": max(0.0, others)}


def pair(args: argparse.Namespace, out: Path) -> dict:
    """The bound: two single-process runs at once, each with half the pairs a day (the same number of negotiations
    in all, nothing shared between them): what the machine's cores give to work split in two."""
    half = argparse.Namespace(**{**vars(args), "negotiations": args.negotiations // 2})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before, busy = os.getloadavg()[0], busy_s()
    procs = []
    for k in range(2):
        cmd = [sys.executable, __file__, "--child", "1", "--days", str(half.days)]
        cmd += ["--negotiations", str(half.negotiations), "--out", str(out / f"half{k}")]
        cmd += ["--scenarios", args.scenarios] if args.scenarios else []
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env))
    runs = []
    for proc in procs:
        stdout, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a half run failed (exit {proc.returncode})")
        runs.append(json.loads(stdout.strip().splitlines()[-1]))
    cpu = sum(r["process_cpu_s"] for r in runs)
    return {
        "workers": "1+1",
        "negotiations": sum(r["negotiations"] for r in runs),
        "wall_s": max(r["wall_s"] for r in runs),  # they start together: the later end is the pair's
        "parent_cpu_s": sum(r["parent_cpu_s"] for r in runs),
        "parent_gc_s": sum(r["parent_gc_s"] for r in runs),
        "workers_cpu_s": 0.0,
        "others_cpu_s": max(0.0, busy_s() - busy - cpu),
        "load_before": before,
        "load_after": os.getloadavg()[0],
    }


def busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, every process) since it booted."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def report(args: argparse.Namespace, runs: list[dict], same: bool) -> None:
    cpus = len(os.sched_getaffinity(0))
    print(f"machine: {platform.machine()}, {cpus} usable CPUs, python {platform.python_version()}")
    source = args.scenarios or "generated"
    print(f"workload: {args.days} days x {args.negotiations} pairs, scenarios {source}, seed 0, rule agents")
    header = (
        "run",
        "workers",
        "negotiations",
        "wall s",
        "neg/s",
        "parent CPU s",
        "parent GC s",
        "workers CPU s",
        "others CPU s",
        "load",
    )
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (3, 7, 12, 8, 8, 12, 11, 13, 12, 11), strict=True)))
    for i, r in enumerate(runs):
        rate = r["negotiations"] / r["wall_s"]
        load = f"{r['load_before']:.2f}->{r['load_after']:.2f}"
        print(
            f"{i + 1:>3} {r['workers']:>7} {r['negotiations']:>12} {r['wall_s']:>8.2f} {rate:>8.0f}"
            f" {r['parent_cpu_s']:>12.2f} {r['parent_gc_s']:>11.2f} {r['workers_cpu_s']:>13.2f}"
            f" {r['others_cpu_s']:>12.2f} {load:>11}"
        )
    arms = sorted({r["workers"] for r in runs}, key=str)
    rates = {w: [r["negotiations"] / r["wall_s"] for r in runs if r["workers"] == w] for w in arms}
    for w, values in rates.items():
        print(f"workers {w}: best {max(values):.0f} neg/s, median {statistics.median(values):.0f} neg/s")
    best = max(rates[2]) / max(rates[1])
    median = statistics.median(rates[2]) / statistics.median(rates[1])
    print(f"ratio 2 workers / 1: best {best:.2f}x, median {median:.2f}x")
    if "1+1" in rates:
        best = max(rates["1+1"]) / max(rates[1])
        median = statistics.median(rates["1+1"]) / statistics.median(rates[1])
        print(
            f"bound, two independent half runs at once / 1: best {best:.2f}x, median {median:.2f}x (what this "
            "machine gives to the same work split in two with nothing shared)"
        )
    cpu = {
        w: statistics.median(r["parent_cpu_s"] + r["workers_cpu_s"] for r in runs if r["workers"] == w) for w in (1, 2)
    }
    print(
        f"CPU of all processes, median: {cpu[1]:.2f} s at 1 worker, {cpu[2]:.2f} s at 2 ({cpu[2] / cpu[1]:.2f}x: "
        "what the workers' round trips cost)"
    )
    print(f"transcripts identical across arms: {'yes' if same else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=12)
    parser.add_argument("--negotiations", type=int, default=1000, help="pairs a day")
    parser.add_argument("--scenarios", default=None, help="as nego simulate --scenarios (default: generated)")
    parser.add_argument("--runs", type=int, default=3, help="runs per arm")
    parser.add_argument(
        "--no-bound", dest="bound", action="store_false", help="leave out the arm of two independent half runs"
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one_run(args.days, args.negotiations, args.scenarios, args.child, args.out)))
        return
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            arms: tuple[int | str, ...] = (1, 2, "1+1") if args.bound else (1, 2)
            for workers in arms if i % 2 == 0 else arms[::-1]:  # alternating, so drifting load hits every arm
                out = Path(tmp) / f"run{i}-w{workers}"
                runs.append(pair(args, out) if workers == "1+1" else child(args, workers, out))
        same = same_transcripts(Path(tmp) / "run0-w1", Path(tmp) / "run0-w2")
    report(args, runs, same)


if __name__ == "__main__":
    main()
