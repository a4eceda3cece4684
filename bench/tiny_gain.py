"""Does GRPO help the tiny seller? Paired comparison of two registered compact models on held-out negotiations.

    python bench/tiny_gain.py                     # tiny vs tiny-rl, 200 held-out scenarios per buyer
    python bench/tiny_gain.py --base tiny --trained tiny-rl --n 300 --out bench/results/tiny_gain.txt
    python bench/tiny_gain.py --split dev --base dev-a --trained dev-a-rl   # choosing defaults: dev split only

The scenarios come from the held-out split (never used for training or for choosing defaults); the buyers are
families absent from the training pool (walker, picky) plus a hardliner as a diagnostic. Both models play the
identical negotiations (greedily, or sampled with the same per-negotiation seeds), so the gain is a paired difference
with a bootstrap 95% interval.
With ``--split dev`` it plays the dev split against buyers from the training families instead: that is where
defaults are chosen; the held-out split and buyers are read once, for the final measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HELDOUT_BUYERS = ("walker", "picky", "hardliner")
# training families (fixed parameters): linear, Boulware, tit-for-tat, an impatient and a demanding buyer, and the
# four families that make stalling cost (at their defaults)
DEV_BUYERS = (
    "timedep:e=1",
    "boulware",
    "tft",
    "timedep:e=1,patience=0.5",
    "timedep:e=0.5,margin=0.1",
    "reciprocal",
    "outside",
    "hazard",
    "deadline",
)
HEADER = "| buyer | base utility | trained utility | gain [95% CI] | deals base / trained | invalid/ep base / trained |"


def paired_gain(
    base: np.ndarray, trained: np.ndarray, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of ``trained - base`` and its percentile-bootstrap 95% interval."""
    d = trained - base
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), (resamples, len(d)))].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)


def _entry(name: str, lookup):
    """A registered model, or a model directory (a checkpoint) given by its path."""
    if os.path.isdir(name):
        from nego.agents.model_registry import ModelEntry

        step = name.rstrip("/").rsplit("-", 1)[-1]
        return ModelEntry(name, name, "", "compact", {}, int(step) if step.isdigit() else 0, {})
    return lookup(name)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="tiny")
    ap.add_argument(
        "--trained", default="tiny-rl", help="comma-separated registered names or model directories (checkpoints)"
    )
    ap.add_argument("--n", type=int, default=200, help="held-out scenarios per buyer")
    ap.add_argument(
        "--skip", type=int, default=0, help="drop the split's first K scenarios (the dev slice a run selects on: 64)"
    )
    ap.add_argument("--split", choices=("heldout", "dev"), default="heldout")
    ap.add_argument("--buyers", default="", help="semicolon-separated specs (default: by split)")
    ap.add_argument("--max-rounds", type=int, default=10)
    ap.add_argument(
        "--openers", choices=("both", "seller"), default="both", help="both: every second scenario opened by the buyer"
    )
    ap.add_argument("--out", default="", help="also write the table to this file")
    ap.add_argument(
        "--temperature", type=float, default=0.0, help="0: greedy; > 0: sample at this temperature (GRPO trains T=1)"
    )
    args = ap.parse_args(argv)

    import torch
    from nego.agents.compact.protocol import CompactFactory, CompactPolicy
    from nego.agents.model_registry import lookup
    from nego.training.evaluate import evaluate
    from nego.training.rollout import split_scenarios
    from nego.training.runner import EpisodeRunner

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    trained = [t.strip() for t in args.trained.split(",") if t.strip()]
    entries = {name: _entry(name, lookup) for name in (args.base, *trained)}
    missing = [k for k, v in entries.items() if v is None]
    if missing:
        print(f"error: model(s) {', '.join(missing)} not registered; run `nego train` first", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    from nego.scenarios.scenario import Role

    openers = (Role.SELLER, Role.BUYER) if args.openers == "both" else (Role.SELLER,)
    scenarios = split_scenarios(args.split, args.skip + args.n, args.max_rounds, openers)[args.skip :]
    default = HELDOUT_BUYERS if args.split == "heldout" else DEV_BUYERS
    buyers = [b.strip() for b in args.buyers.split(";") if b.strip()] if args.buyers else default
    temperature = args.temperature or None
    learners = {name: CompactFactory(name, CompactPolicy.load(e.path), temperature) for name, e in entries.items()}
    with EpisodeRunner(learners) as runner:
        res = {name: evaluate(runner, name, scenarios, buyers, seed=1) for name in entries}
    decoding = "greedy" if temperature is None else f"sampled at T={temperature:g}"
    skipped = f" (after the first {args.skip})" if args.skip else ""
    lines = [
        f"{args.split} split: {args.n} scenarios{skipped} x {len(buyers)} buyers, {args.max_rounds} rounds, "
        f"opened by {'seller and buyer alternately' if args.openers == 'both' else 'the seller'}, {decoding}, "
        "paired bootstrap (10,000 resamples)",
    ]
    for name in trained:
        lines += [
            "",
            f"base = {args.base} ({entries[args.base].path}), trained = {name} ({entries[name].path}, "
            f"{entries[name].steps} GRPO steps)",
            "",
            HEADER,
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for b in buyers:
            rb, rt = res[args.base][b], res[name][b]  # DevEvaluation: looked up by buyer spec
            g, lo, hi = paired_gain(np.array(rb.utility), np.array(rt.utility))
            lines.append(
                f"| {b} (n={len(rb.utility)}) | {rb.mean_utility:.3f} | {rt.mean_utility:.3f} | "
                f"{g:+.4f} [{lo:+.4f}, {hi:+.4f}] | {rb.deal_rate:.2f} / {rt.deal_rate:.2f} | "
                f"{rb.invalid_per_episode:.2f} / {rt.invalid_per_episode:.2f} |"
            )
        base_mean = np.mean([res[args.base][b].mean_utility for b in buyers])
        trained_mean = np.mean([res[name][b].mean_utility for b in buyers])
        lines.append(
            f"\nmean utility over the {len(buyers)} buyers (each weighted alike): base {base_mean:.3f}, "
            f"trained {trained_mean:.3f}"
        )
    lines.append(f"\n({time.perf_counter() - t0:.0f} s)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
