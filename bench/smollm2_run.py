"""The SmolLM2 learning run as a user runs it: `nego train --model smollm2` (its default run, or with the options
given), then `nego eval` of the shipped model's warm start and trained model beside the reference rule sellers on a
frozen suite. Prints and writes wall time, CPU time and peak memory of each command, the training log's phase lines
(each with the peak resident memory of the training process since the line before it, sampled twice a second, so
the warm start, each GRPO stretch and each dev evaluation show what they held at most, and the minutes since the
command started) and the evaluation's tables.

    python bench/smollm2_run.py                                  # the default run, evaluated on eval-192
    python bench/smollm2_run.py --train-args "--steps 1"         # the warm start and one GRPO step
    python bench/smollm2_run.py --suite eval-1152 --train-args "--steps 40 --group-size 8 --use-vllm"   # on a GPU

Each run gets a fresh ``$NEGO_HOME`` under ``--work`` (the converted SmolLM2 folder of the current ``$NEGO_HOME`` is
linked into it when there is one, so nothing is converted twice), so the registered names never clash with a
user's models. Exits non-zero when a command fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
PHASES = re.compile(
    r"^(preflight|  episodes|  max_tokens|  finetune|  batch|  memory|warm start|registered|step \d+|done in"
    r"|  dev buyer|  \S+ +[\d.]+ / [\d.]+ / )"  # and each dev evaluation's table
)


class PeakMemory:
    """Samples the resident memory of a process and its children twice a second; :meth:`take` returns the peak since
    the last call (what one phase of the run used at most) and starts the next interval."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self._peak = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        total = 0
        for p in (self._proc, *self._proc.children(recursive=True)):
            with contextlib.suppress(psutil.Error):  # a process that ended meanwhile
                total += p.memory_info().rss
        return total

    def _sample(self) -> None:
        while not self._done.wait(0.5):
            try:
                rss = self._rss()
            except psutil.Error:
                return
            with self._lock:
                self._peak = max(self._peak, rss)

    def take(self) -> int:
        with self._lock:
            peak, self._peak = self._peak, 0
        if peak == 0:  # no sample fell in the interval: what it holds now
            with contextlib.suppress(psutil.Error):
                peak = self._rss()
        return peak

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def run(label: str, args: list[str], env: dict[str, str], lines: list[str], keep: re.Pattern | None) -> int:
    """Run one command, echoing its output (all of it, or the lines ``keep`` matches) and its costs into ``lines``."""
    shown = ["python" if a == sys.executable else a for a in args]
    lines.append(f"\n## {label}: {shlex.join(shown)}")
    print(lines[-1], flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    memory = PeakMemory(proc.pid)
    for line in proc.stdout:
        line = line.rstrip("\n").replace(env["NEGO_HOME"], "$NEGO_HOME")  # the run's home is a scratch folder
        if keep is None or keep.match(line) or line.startswith(("WARNING", "error", "warning")):
            if keep is not None:  # a phase line: how much memory the phase it closes held at most, and when
                minutes = (time.perf_counter() - t0) / 60
                line = f"{line}  [peak RSS {memory.take() / 2**30:.2f} GiB, {minutes:.1f} min]"
            lines.append(line)
            print(line, flush=True)
    rc = proc.wait()
    memory.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    lines.append(
        f"-> exit {rc}; wall {time.perf_counter() - t0:.0f} s, CPU {cpu:.0f} s, peak memory of the largest process "
        f"so far {after.ru_maxrss / 2**20:.2f} GiB"
    )
    print(lines[-1], flush=True)
    return rc


def fresh_home(work: Path) -> Path:
    """A new ``$NEGO_HOME`` under ``work``, with the current home's converted SmolLM2 folder linked in if present."""
    from nego.agents.llm.backends.smollm2 import cache_folder

    converted = cache_folder()
    home = work / "home"
    (home / "models").mkdir(parents=True, exist_ok=True)
    if converted.is_dir() and not (home / "models" / converted.name).exists():
        (home / "models" / converted.name).symlink_to(converted.resolve(), target_is_directory=True)
    return home


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-args", default="", help="options added to `nego train --model smollm2`")
    ap.add_argument("--suite", default="eval-192", help="suite of the evaluation ('none' to skip it)")
    ap.add_argument("--eval-args", default="", help="options added to `nego eval`")
    ap.add_argument("--work", type=Path, default=None, help="folder for the run's home, runs and evaluation")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "smollm2_run.txt")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="nego-smollm2-"))
    env = {**os.environ, "NEGO_HOME": str(fresh_home(work)), "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}
    nego = [sys.executable, "-m", "nego.cli.app"]
    lines = [
        f"# python bench/smollm2_run.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}".rstrip(),
        f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {os.cpu_count()} CPUs visible",
    ]
    print("\n".join(lines), flush=True)
    train = [*nego, "train", "--model", "smollm2", "--no-live", *shlex.split(args.train_args)]
    rc = run("training", train, env, lines, PHASES)
    if rc == 0 and args.suite != "none":
        sellers = "smollm2-bc,smollm2-bc-rl"
        evaluate = [*nego, "eval", "--sellers", sellers, "--suite", args.suite, "--out", str(work / "eval")]
        rc = run("evaluation", [*evaluate, *shlex.split(args.eval_args)], env, lines, None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
