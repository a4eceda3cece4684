"""What playing GRPO rollouts through the market costs, against a bare loop over the protocol.

One warm-started tiny model trains with the wiring of ``nego train`` (``grpo.build_trainer``) in two arms that
differ only in how a step's negotiations are played:

- market: the episode runner (``Marketplace`` with child seeds, caps, the learner's scorer and Parquet transcripts
  of every rollout, one part per step);
- bare: ``asyncio.gather`` of ``run_negotiation`` with the same negotiators, seeds and reward, nothing written.

Arms alternate in blocks of ``--block`` steps (each block continues its arm's own trainer), so drift in machine load
hits both alike; the figure is CPU seconds of this process per GRPO step (rollout, forward, backward, optimizer,
logging), whose ratio the bench prints. The default is 2 x 3 blocks of 10 steps on 1 torch thread.

    python bench/train_overhead.py --out bench/results/train_overhead.txt
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def bare_rollout_cls():
    from nego.agents.compact.protocol import CompactNegotiator, CompactPolicy
    from nego.agents.registry import resolve
    from nego.market.marketplace import child_seeds
    from nego.market.protocol import run_negotiation
    from nego.scenarios.scenario import Role
    from nego.training.rewards import outcome_scorer
    from nego.training.rollout import MarketRollout, step_jobs, to_trl
    from nego.training.runner import Rollout

    class BareRollout(MarketRollout):
        """The same jobs, negotiators, seeds and reward, played by a bare ``asyncio.gather``; nothing written."""

        def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
            step = int(trainer.state.global_step)
            scenarios = [self.scenarios[str(p)] for p in prompts]
            jobs = step_jobs(
                scenarios, self.pool, seller=self.spec, seed=self.seed, step=step, group_size=self.group_size
            )
            model = trainer.accelerator.unwrap_model(trainer.model)
            model.eval()
            policy = CompactPolicy(model, self.tokenizer)
            score = outcome_scorer(None, 0.1)

            async def one(job):
                s, b = child_seeds(job.seed)
                seller = CompactNegotiator(policy, Role.SELLER, s, float(trainer.temperature))
                result = await run_negotiation(job.scenario, seller, resolve(job.buyer)(Role.BUYER, b), seed=job.seed)
                return Rollout(job, result, seller.record(result), score(job, result))

            async def all_jobs():
                return await asyncio.gather(*(one(j) for j in jobs))

            self.last = asyncio.run(all_jobs())
            model.train()
            self.stats.record(self.last, 0.0)
            return to_trl([r.sample for r in self.last], self.max_tokens)

    return BareRollout


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps per run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per arm (arms alternate)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)

    import copy

    import torch
    from nego.training import grpo
    from nego.training.config import TrainConfig
    from nego.training.sanity import warm_start

    torch.set_num_threads(args.threads)
    cfg = TrainConfig(
        steps=args.steps,
        eval_every=0,
        save_every=0,
        time_budget_min=0,
        threads=args.threads,
        sft_episodes=512,
        sft_steps=100,
        train_scenarios=256,
        temperature=1.0,  # the temperature its results were measured at
    ).validate()
    model, tok, _ = warm_start(cfg)
    cpu: dict[str, list[float]] = {"market": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, cls in (("market", None), ("bare", bare_rollout_cls())):
                run_dir = Path(tmp) / f"{name}-{r}"
                c0 = time.process_time()
                with grpo.open_runner(cfg, run_dir) as runner:
                    parts = grpo.build_trainer(
                        cfg,
                        copy.deepcopy(model),
                        tok,
                        run_dir,
                        lambda s: None,
                        time.perf_counter(),
                        runner,
                        rollout_cls=cls,
                    )
                    parts.trainer.train()
                cpu[name].append((time.process_time() - c0) / args.steps)
    market, bare = np.array(cpu["market"]), np.array(cpu["bare"])
    lines = [
        "GRPO steps through the market runner (transcripts on) vs a bare asyncio.gather of run_negotiation",
        f"tiny model, {cfg.scenarios_per_step} scenarios x group {cfg.group_size} per step, {args.steps} steps per "
        f"run, {args.repeats} runs per arm, alternating, torch threads {args.threads}; CPU s of this process per step",
        f"market: {market.mean():.3f} (runs {', '.join(f'{x:.3f}' for x in market)})",
        f"bare:   {bare.mean():.3f} (runs {', '.join(f'{x:.3f}' for x in bare)})",
        f"ratio market / bare: {market.mean() / bare.mean():.3f} (pairs: "
        f"{', '.join(f'{m / b:.3f}' for m, b in zip(market, bare, strict=True))})",
        f"steps per CPU-minute: market {60 / market.mean():.1f}, bare {60 / bare.mean():.1f}",
        "command: python bench/train_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    ]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
