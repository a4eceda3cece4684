"""Sellers side by side on the dev split: registered compact models and rule sellers on the same negotiations.

    python bench/seller_table.py --models ws-a,ws-b --rules tft,linear,conceder,boulware --n 100
    python bench/seller_table.py --rules tft --rendered timedep:e=0.2,step=0.05 --n 100   # what the words cost a rule

Every seller plays the identical negotiations (dev-split scenarios, both openers, the buyers of the training
families that ``bench/tiny_gain.py --split dev`` uses, per-negotiation seeds shared), so differences are paired.
Per buyer: each seller's mean utility and deal rate, and each model's paired difference to the best rule seller for
that buyer with a bootstrap 95% interval. This is where defaults are chosen: the held-out split and buyers are not
read here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nego.cli.options import split_specs  # the CLI's reading: parameters after a comma stay with their spec
from tiny_gain import DEV_BUYERS, paired_gain


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated registered compact models")
    ap.add_argument("--rules", default="tft,linear,conceder,boulware,timedep:e=0.3,timedep:e=3")
    ap.add_argument("--n", type=int, default=100, help="dev scenarios (each played with both openers)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    ap.add_argument(
        "--rendered",
        default="",
        help="rule sellers also played through the compact protocol's offer words, as a warm start records them "
        "(SPEC@levels, SPEC@aim): what each rendering costs the rule",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="", help="also write the table to this file")
    args = ap.parse_args(argv)

    import torch
    from nego.agents.compact.protocol import CompactFactory, CompactPolicy
    from nego.agents.model_registry import lookup
    from nego.agents.registry import resolve
    from nego.scenarios.scenario import Role
    from nego.training.evaluate import evaluate
    from nego.training.rollout import split_scenarios
    from nego.training.runner import EpisodeRunner
    from nego.training.sft import RecordingFactory

    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    rules = split_specs(args.rules)
    missing = [m for m in models if lookup(m) is None]
    if missing:
        print(f"error: model(s) {', '.join(missing)} not registered", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    scenarios = split_scenarios("dev", args.n, 10, (Role.SELLER, Role.BUYER))  # n scenarios, openers alternating
    temperature = args.temperature or None
    factories = {m: CompactFactory(m, CompactPolicy.load(lookup(m).path), temperature) for m in models}
    factories.update({r: resolve(r) for r in rules})
    for r in split_specs(args.rendered):
        if r not in rules:
            rules.append(r)
            factories[r] = resolve(r)
        factories.update({f"{r}@levels": RecordingFactory(r), f"{r}@aim": RecordingFactory(r, aims=True)})
    rendered = [n for n in factories if "@" in n]
    with EpisodeRunner(factories) as runner:
        res = {name: evaluate(runner, name, scenarios, DEV_BUYERS, seed=1) for name in factories}
    names = [*models, *rules, *rendered]
    lines = [
        f"dev split: {len(scenarios)} negotiations per buyer (openers alternating), 10 rounds, "
        f"{'greedy' if temperature is None else f'sampled at T={temperature:g}'}; mean seller utility (deal rate)",
        "",
        "| " + " | ".join(["buyer", *names, *(f"{m} - best rule [95% CI]" for m in models)]) + " |",
        "| --- " * (1 + len(names) + len(models)) + "|",
    ]
    for b in DEV_BUYERS:
        cells = [f"{res[n][b].mean_utility:.3f} ({res[n][b].deal_rate:.2f})" for n in names]
        best = max(rules, key=lambda r: res[r][b].mean_utility) if rules else None
        gaps = []
        for m in models:
            g, lo, hi = paired_gain(np.array(res[best][b].utility), np.array(res[m][b].utility))
            gaps.append(f"{g:+.3f} [{lo:+.3f}, {hi:+.3f}] vs {best}")
        lines.append("| " + " | ".join([b, *cells, *gaps]) + " |")
    means = {n: np.mean([res[n][b].mean_utility for b in DEV_BUYERS]) for n in names}
    lines += ["", "mean over the buyers (each weighted alike): " + ", ".join(f"{n} {means[n]:.3f}" for n in names)]
    lines.append(f"({time.perf_counter() - t0:.0f} s)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(f"$ python bench/seller_table.py {' '.join(argv or sys.argv[1:])}\n{text}\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
