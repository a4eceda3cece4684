"""GRPO plumbing sanity check: does the real ``rollout_func`` path raise a reward that is easy to learn?

    python bench/grpo_sanity.py                        # first-offer reward, lr 3e-5 and 1e-3, ~2 minutes, 1 thread
    python bench/grpo_sanity.py --rewards first-offer,outcome --lrs 3e-5,1e-4,1e-3 --out bench/results/grpo_sanity.txt
    python bench/grpo_sanity.py --compare-run $NEGO_HOME/runs/tiny   # trained vs base: greedy and sampled

A tiny model gets a short warm start (behaviour cloning of rule-based sellers), then GRPO runs through the
training wiring of ``nego train`` (``grpo.build_trainer``: same GRPOConfig, the market rollout, env_mask,
logging) on a fixed handful of scenarios against one fixed deterministic buyer. Only the reward differs:

- ``first-offer``: 1 - the seller's own utility of its FIRST offer (0 when its first move is not a valid
  offer), read from the structured turns. The warm start opens near utility 1, so this reward asks for the
  opposite of what was cloned, depends on a handful of tokens, and differs strongly within a group;
- ``outcome``: the real training reward (seller utility of the deal, reservation otherwise).

Besides the reward curve it checks the plumbing directly: every reward row belongs to the prompt it was
scored for (episodes come back in TRL's order), and the log-probabilities the rollout recorded for the
seller's own tokens equal the ones the trained model computes for the same ids (no misaligned mask or
stale policy). The verdict compares the mean rollout reward of the first and last 10 steps.

``--compare-run RUN`` instead compares a finished run's ``final`` with its ``base`` on the dev split, greedily
(what the evaluations report) and sampled at temperature 1 (what GRPO optimizes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

WINDOW = 10


def summarize(lr: float, arm: Any) -> tuple[list[str], bool]:
    """Report lines for one arm and whether its reward rose clearly (last window vs first, beyond noise)."""
    logs, checks, rewards = arm.logs, arm.checks, arm.rewards
    w = min(WINDOW, len(rewards) // 2)
    first, last = float(np.mean(rewards[:w])), float(np.mean(rewards[-w:]))
    zero_std = float(np.mean([row.get("frac_reward_zero_std", 0.0) for row in logs]))
    grad = float(np.mean([row.get("grad_norm", 0.0) for row in logs]))
    lrs = sorted({row.get("learning_rate") for row in logs})
    learned = last - first > 2 * float(np.std(rewards[:w])) / np.sqrt(w) + 0.02
    lines = [
        f"lr {lr:g}: mean reward first {w} steps {first:.3f} -> last {w} steps {last:.3f} "
        f"({'RISES' if learned else 'flat'}), {len(logs)} steps in {arm.seconds:.0f}s",
        f"  within-group reward std {np.mean(checks.group_std[:w]):.3f} -> {np.mean(checks.group_std[-w:]):.3f}; "
        f"share of zero-std groups {zero_std:.2f}; mean grad norm {grad:.3f}; logged learning rates {lrs}",
        f"  plumbing: misaligned reward rows {int(sum(checks.misaligned))}; max |recorded - recomputed| "
        f"log-prob of own tokens {max(checks.logprob_gap):.2e}",
        "  step: " + " ".join(f"{row['step']}:{row['reward']:.2f}" for row in logs[:: max(1, len(logs) // 10)]),
    ]
    return lines, learned


def sampled_vs_greedy(run_dir: str, n: int, repeats: int, buyers: tuple[str, ...]) -> list[str]:
    """Paired dev-split utility of ``run_dir/final`` minus ``run_dir/base``: greedy (what the evaluations report)
    and sampled at temperature 1 (what GRPO optimizes), with normal-approximation 95% intervals."""
    from nego.agents.compact.protocol import CompactFactory, CompactPolicy
    from nego.market.marketplace import Job
    from nego.training.rollout import split_scenarios
    from nego.training.runner import EpisodeRunner

    policies = {k: CompactPolicy.load(str(Path(run_dir) / k)) for k in ("base", "final")}
    scenarios = split_scenarios("dev", n, 8)
    lines = [f"{run_dir}: final - base on {n} dev scenarios (greedy once; sampled at T=1 {repeats} times)"]
    for spec in buyers:
        for temp, reps in ((None, 1), (1.0, repeats)):
            u = {}
            for k, pol in policies.items():
                jobs = [Job(sc, k, spec, 7000 * r + i) for r in range(reps) for i, sc in enumerate(scenarios)]
                with EpisodeRunner({k: CompactFactory(k, pol, temp)}) as runner:
                    u[k] = np.array([p.result.outcome.seller_utility for p in runner.play(jobs)])
            d = u["final"] - u["base"]
            ci = 1.96 * d.std() / np.sqrt(len(d))
            lines.append(
                f"  {spec:28s} {'greedy' if temp is None else 'T=1   '}: base {u['base'].mean():.3f} "
                f"final {u['final'].mean():.3f} gain {d.mean():+.4f} [{d.mean() - ci:+.4f}, {d.mean() + ci:+.4f}]"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rewards", default="first-offer", help="comma-separated: first-offer, outcome")
    ap.add_argument("--lrs", default="3e-5,1e-3", help="comma-separated GRPO learning rates, one arm each")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--buyer", default="timedep:e=3", help="the one fixed training buyer (deterministic)")
    ap.add_argument("--scenarios", type=int, default=4, help="fixed training scenarios (scenarios per step)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-rounds", type=int, default=6)
    ap.add_argument("--sft-steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="also write the report to this file")
    ap.add_argument("--compare-run", default="", help="instead: greedy vs sampled gain of RUN/final over RUN/base")
    args = ap.parse_args(argv)
    if args.compare_run:
        import torch

        torch.set_num_threads(args.threads)
        buyers = ("timedep:e=1", "tft", "timedep:e=0.5,margin=0.1", "boulware", "timedep:e=1,patience=0.5")
        lines = sampled_vs_greedy(args.compare_run, 100, 3, buyers)
        print("\n".join(lines))
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")
        return 0

    import torch
    from nego.training.config import TrainConfig
    from nego.training.sanity import run_sanity, warm_start

    torch.set_num_threads(args.threads)
    cfg = TrainConfig(
        train_buyers=[args.buyer],
        train_scenarios=args.scenarios,
        scenarios_per_step=args.scenarios,
        group_size=args.group,
        steps=args.steps,
        max_rounds=args.max_rounds,
        sft_episodes=512,
        sft_steps=args.sft_steps,
        sft_batch=16,
        sft_lr=3e-3,
        eval_every=0,
        save_every=0,
        time_budget_min=0,
        threads=args.threads,
        seed=args.seed,
        temperature=1.0,  # the temperature its results were measured at
    ).validate()
    t0 = time.perf_counter()
    model, tok, sft_loss = warm_start(cfg)
    report = [
        f"GRPO sanity check: buyer {args.buyer}, {args.scenarios} fixed train scenarios x "
        f"group {args.group}, max_rounds {args.max_rounds}, {args.steps} steps, loss {cfg.loss_type}, "
        f"beta {cfg.beta}, temperature {cfg.sampling_temperature}, torch threads {args.threads}",
        f"warm start: {args.sft_steps} SFT steps, final loss {sft_loss:.3f} ({time.perf_counter() - t0:.0f}s)",
    ]
    print("\n".join(report), flush=True)
    verdicts = []
    for kind in args.rewards.split(","):
        for lr in (float(x) for x in args.lrs.split(",")):
            lines, learned = summarize(lr, run_sanity(replace(cfg, lr=lr), model, tok, kind))
            lines[0] = f"reward {kind}, " + lines[0]
            verdicts.append(learned)
            print("\n".join(lines), flush=True)
            report += lines
    cmd = "python bench/grpo_sanity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report.append(f"verdict: {'the plumbing learns' if any(verdicts) else 'NO arm learned'}  ({cmd.strip()})")
    print(report[-1])
    if args.out:
        Path(args.out).write_text("\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
