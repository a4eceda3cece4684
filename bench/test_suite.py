"""How long the README's test command takes: the whole suite in its two test processes (``pyproject.toml``'s
``-n 2``), and optionally in one (``-n 0``) for the ratio, each arm in a fresh subprocess on the same machine.

Prints per arm the wall time, the CPU time of the run and all its children (the test processes and what they start),
and pytest's own summary line; with both arms, the ratio of their wall times. Appends the report to
``bench/results/test_suite.txt`` with the command line.

    python bench/test_suite.py                         # the README's command only (about 12 minutes on 2 cores)
    python bench/test_suite.py --arms parallel,serial  # both, for the ratio (the serial arm takes over 20 minutes)
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARMS = {"parallel": [], "serial": ["-n", "0"]}


def run(extra: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *extra], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = done.stdout.strip().splitlines()
    return {"status": done.returncode, "wall": wall, "cpu": cpu, "summary": lines[-1] if lines else done.stderr[-300:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="parallel", help="comma-separated: parallel, serial")
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arm(s) {sorted(unknown)}; choose from {sorted(ARMS)}")
    out = [
        f"$ python bench/test_suite.py --arms {args.arms}",
        f"# {time.strftime('%Y-%m-%d %H:%M')}, {len(os.sched_getaffinity(0))} usable CPUs, "
        f"python {platform.python_version()}, load average before {os.getloadavg()[0]:.2f}",
    ]
    results = {}
    for arm in arms:
        r = results[arm] = run(ARMS[arm])
        out.append(
            f"{arm:>8} ({' '.join(['pytest', *ARMS[arm]])}): wall {r['wall']:.0f} s ({r['wall'] / 60:.1f} min), "
            f"CPU {r['cpu']:.0f} s, exit {r['status']}; {r['summary']}"
        )
    if len(results) == 2:
        out.append(f"serial / parallel wall: {results['serial']['wall'] / results['parallel']['wall']:.2f}x")
    text = "\n".join(out)
    print(text)
    with open(ROOT / "bench" / "results" / "test_suite.txt", "a") as f:
        f.write(text + "\n\n")
    sys.exit(max(r["status"] for r in results.values()))


if __name__ == "__main__":
    main()
