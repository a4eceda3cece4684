"""How often a warm-started SmolLM2 writes an invalid move on the dev split, with and without repair examples.

For each repair rate (``--repairs``: the share of the rule sellers' offers first shown as an invalid reply with the
protocol's feedback, ``sft_repairs``), the warm start of ``nego train --model smollm2`` runs through the product's own
path (its preset, the preflight, ``chat_warm_start``) into ``RUNS/repairs-R/base`` (a base already there is reused,
as a resumed run reuses it), and the warm-started model then plays ``--dev`` negotiations of the dev split against the
dev buyers in turn, at each sampling temperature of ``--temperatures``, in the conversation and reply format it was
trained on. Printed per arm: seller attempts and the share invalid, first attempts invalid, retries that were
valid, deals, mean seller utility, the commonest reasons, and seconds. Nothing held out is read.

    python bench/smollm2_repairs.py --repairs 0,0.25 --temperatures 1.0 --dev 8 --out bench/results/smollm2_repairs.txt
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path


def warm_start(rate: float, runs: Path, threads: int, echo) -> Path:
    from nego.training.config import model_preset
    from nego.training.grpo import open_runner

    cfg = replace(model_preset("smollm2"), sft_repairs=rate, threads=threads, name=f"repairs-{rate:g}")
    cfg = cfg.validate()
    cfg = cfg.kind.resolve(cfg)
    run_dir = runs / f"repairs-{rate:g}"
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open_runner(cfg, run_dir) as runner:
        start = cfg.kind.start(cfg, run_dir, runner, echo, started)
    echo(f"warm start with sft_repairs={rate:g}: {start.warm_start_steps} steps, {time.perf_counter() - started:.0f}s")
    return run_dir / "base"


def play(base: Path, temperature: float, n: int) -> list[str]:
    from nego.agents.model_specs import LLMSettings
    from nego.agents.registry import resolve
    from nego.market.marketplace import Job, run_jobs
    from nego.market.rates import invalid_per_move_of
    from nego.market.types import EndReason
    from nego.scenarios.scenario import Role
    from nego.training.chat_kind import SMALL_TEMPLATE
    from nego.training.config import DEV_BUYERS, model_preset
    from nego.training.rollout import split_scenarios

    preset = model_preset("smollm2")
    settings = LLMSettings(template=SMALL_TEMPLATE, max_tokens=preset.turn_tokens, temperature=temperature)
    spec = f"hf:{base}"
    jobs = [Job(sc, spec, DEV_BUYERS[i % len(DEV_BUYERS)], 1000 + i) for i, sc in enumerate(split_scenarios("dev", n))]
    t0 = time.perf_counter()
    results = run_jobs(lambda s: resolve(s, settings), jobs, concurrency=n)
    seconds = time.perf_counter() - t0
    attempts = [t for r in results for t in r.turns if t.role is Role.SELLER]
    invalid = [t for t in attempts if not t.valid]
    first = [t for t in attempts if t.attempt == 0]
    retries = [t for t in attempts if t.attempt > 0]
    fixed = sum(t.valid for t in retries)
    reasons = collections.Counter(_reason(t.feedback or "") for t in invalid)
    deals = sum(r.outcome.end_reason is EndReason.AGREEMENT for r in results)
    utility = sum(r.outcome.seller_utility for r in results) / len(results)
    lines = [
        f"  T={temperature:g}: seller attempts {len(attempts)}, invalid {len(invalid)} "
        f"({invalid_per_move_of(results):.1%}); first attempts invalid "
        f"{sum(not t.valid for t in first)}/{len(first)}; retries valid {fixed}/{len(retries)}; "
        f"deals {deals}/{n}; mean seller utility {utility:.3f}; {seconds:.0f}s",
    ]
    lines += [f"      {k:4d}  {reason}" for reason, k in reasons.most_common(6)]
    return lines


def _reason(feedback: str) -> str:
    """The kind of mistake a feedback names, without the values (``price must be ...; got 4086`` -> ``price must``)."""
    head = feedback.split(";")[0].split(":")[0]
    words = head.split()
    if head.startswith("missing value"):
        return "missing value(s)"
    if len(words) > 2 and words[1] == "must":
        return "a value out of range, off its grid or not an option"
    return " ".join(words[:8])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repairs", default="0,0.25", help="comma-separated repair rates in [0, 1]")
    parser.add_argument("--temperatures", default="1.0", help="comma-separated sampling temperatures")
    parser.add_argument("--dev", type=int, default=8, help="dev negotiations per arm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", default="", help="where the warm starts go (default: $NEGO_HOME/bench-repairs)")
    parser.add_argument("--out", default="", help="append the report to this file")
    args = parser.parse_args()
    from nego.agents.model_registry import nego_home
    from nego.agents.threads import set_threads

    set_threads(args.threads)
    runs = Path(args.runs) if args.runs else nego_home() / "bench-repairs"
    lines = [
        f"# python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}",
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load before "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
    ]
    for rate in (float(r) for r in args.repairs.split(",")):
        base = warm_start(rate, runs, args.threads, print)
        lines.append(f"sft_repairs={rate:g} (warm start of the smollm2 preset)")
        for temperature in (float(t) for t in args.temperatures.split(",")):
            played = play(base, temperature, args.dev)
            lines += played
            print("\n".join(played), file=sys.stderr, flush=True)  # progress; the report below is the record
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    lines.append(
        f"peak memory of this process {peak:.2f} GiB; load after " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write(report + "\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
