"""GRPO steps of the tiny seller with the loss read in length buckets (``pack``) vs TRL's one padded matrix.

Both arms train copies of the same warm model (``--warm DIR``, as ``bench/grpo_profile.py`` fills it) with the wiring
of ``nego train`` (``grpo.open_runner`` + ``grpo.build_trainer``, 8 scenarios x 8 negotiations per step) and the same
seeds, alternating in blocks of ``--steps`` steps (each block a fresh trainer), no profiler. Per arm: CPU seconds
per step and steps per CPU-minute (the whole step, rollout included), the CPU seconds of the loss forward
(``compute_loss``) and of the backward per step, the tokens the loss forward computes per step (padding included),
and whether both arms saw the same rewards step for step.

    python bench/grpo_packing.py --threads 1 --steps 3 --repeats 3 --warm DIR --out bench/results/grpo_packing.txt
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from grpo_profile import Measured, _Quiet, config, rollout_cls, warm_model

ARMS = ("padded", "pack")


@dataclass
class Block:
    """One block of steps: CPU seconds in all, in the loss forward and in the backward; tokens the loss computed."""

    cpu: float = 0.0
    wall: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    tokens: int = 0
    rewards: list[list[float]] = field(default_factory=list)


def timed(block: Block, name: str, fn: Any) -> Any:
    """``fn`` with its CPU time added to ``block.<name>``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(block, name, getattr(block, name) + time.process_time() - t0)

    return wrapper


def counting_cls(arm: str, block: Block, seen: Measured) -> type:
    """The bench rollout (kept KV cache), also counting the tokens the arm's loss forward computes."""
    from nego.training.packing import plan_buckets

    base = rollout_cls("new", seen)

    class Counting(base):  # type: ignore[misc, valid-type]
        def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
            out = super().__call__(prompts, trainer)
            block.rewards.append(list(out["reward"]))
            prompts_, completions = out["prompt_ids"], out["completion_ids"]
            if arm == "pack":
                lengths = [len(p) + len(c) for p, c in zip(prompts_, completions, strict=True)]
                buckets = plan_buckets(lengths, max_rows=len(lengths))
                block.tokens += sum(len(b) * max(2, max(lengths[i] for i in b)) for b in buckets)
            else:
                block.tokens += len(prompts_) * (max(map(len, prompts_)) + max(map(len, completions)))
            return out

    return Counting


def run_block(cfg: Any, model: Any, tok: Any, arm: str) -> Block:
    """Train a copy of ``model`` for ``cfg.steps`` steps in ``arm``."""
    from nego.training import grpo

    block, seen = Block(), Measured()
    cfg = replace(cfg, pack=arm == "pack")
    with tempfile.TemporaryDirectory() as tmp, grpo.open_runner(cfg, Path(tmp)) as runner:
        parts = grpo.build_trainer(
            cfg,
            copy.deepcopy(model),
            tok,
            Path(tmp),
            lambda s: None,
            time.perf_counter(),
            runner,
            rollout_cls=counting_cls(arm, block, seen),
            observer=_Quiet(),
        )
        trainer = parts.trainer
        trainer.compute_loss = timed(block, "forward", trainer.compute_loss)
        trainer.accelerator.backward = timed(block, "backward", trainer.accelerator.backward)
        c0, w0 = time.process_time(), time.perf_counter()
        trainer.train()
        block.cpu, block.wall = time.process_time() - c0, time.perf_counter() - w0
    return block


def per_step(blocks: list[Block], name: str, steps: int) -> Any:
    import numpy as np

    return np.array([getattr(b, name) / steps for b in blocks])


def _blocks(values: Any) -> str:
    return ", ".join(f"{x:.2f}" for x in values)


def report(blocks: dict[str, list[Block]], steps: int) -> list[str]:
    """Per arm and the ratios, from alternating blocks of ``steps`` steps."""
    lines = []
    for arm in ARMS:
        cpu = per_step(blocks[arm], "cpu", steps)
        fwd, bwd = per_step(blocks[arm], "forward", steps), per_step(blocks[arm], "backward", steps)
        lines.append(
            f"{arm:>6}: {cpu.mean():.2f} CPU s per step ({60 / cpu.mean():.1f} steps per CPU-minute; blocks "
            f"{_blocks(cpu)}), {per_step(blocks[arm], 'wall', steps).mean():.2f} wall s; loss forward "
            f"{fwd.mean():.3f}, backward {bwd.mean():.3f} CPU s per step; the loss computes "
            f"{per_step(blocks[arm], 'tokens', steps).mean():.0f} tokens per step"
        )
    old, new = per_step(blocks["padded"], "cpu", steps), per_step(blocks["pack"], "cpu", steps)
    loss = {arm: per_step(blocks[arm], "forward", steps) + per_step(blocks[arm], "backward", steps) for arm in ARMS}
    pairs = [
        (a, b)
        for x, y in zip(blocks["padded"], blocks["pack"], strict=True)
        for a, b in zip(x.rewards, y.rewards, strict=True)
    ]
    gap = max(abs(u - v) for a, b in pairs for u, v in zip(a, b, strict=True))
    return [
        *lines,
        f"steps per CPU-minute: padded {60 / old.mean():.1f}, pack {60 / new.mean():.1f}, ratio "
        f"{old.mean() / new.mean():.2f}x (blocks {_blocks(old / new)})",
        f"loss forward + backward CPU per step: padded {loss['padded'].mean():.3f}, pack {loss['pack'].mean():.3f}, "
        f"ratio {loss['padded'].mean() / loss['pack'].mean():.2f}x (blocks {_blocks(loss['padded'] / loss['pack'])})",
        f"same rewards in both arms, step by step: {all(a == b for a, b in pairs)} (largest difference {gap:.2g})",
    ]


def compare(args: argparse.Namespace, cfg: Any, model: Any, tok: Any) -> list[str]:
    import torch

    lines = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        blocks: dict[str, list[Block]] = {arm: [] for arm in ARMS}
        for _ in range(args.repeats):
            for arm in ARMS:
                blocks[arm].append(run_block(cfg, model, tok, arm))
        lines.append(
            f"\n== torch threads {threads}: {args.repeats} blocks of {cfg.steps} GRPO steps per arm, alternating"
        )
        lines += report(blocks, cfg.steps)
    return lines


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="GRPO steps per block")
    ap.add_argument("--repeats", type=int, default=3, help="blocks per arm")
    ap.add_argument("--threads", default="1", help="torch thread counts, comma-separated")
    ap.add_argument("--sft-episodes", type=int, default=512, help="warm start of the trained model: episodes")
    ap.add_argument("--sft-steps", type=int, default=100, help="warm start of the trained model: SFT steps")
    ap.add_argument("--warm", default="", help="load the warm-started model from DIR, or save it there")
    ap.add_argument("--out", default="", help="write the report here")
    args = ap.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]

    from nego.agents.threads import set_threads

    set_threads(max(args.threads))
    import torch

    command = "python bench/grpo_packing.py " + " ".join(argv if argv is not None else sys.argv[1:])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    cfg = config(args)
    model, tok, note = warm_model(cfg, args.warm)
    lines = [
        f"command: {command}",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average at start {load}; CPU s = this process's",
        f"tiny model {note}; {cfg.scenarios_per_step} scenarios x group {cfg.group_size} per step, "
        f"loss_type {cfg.loss_type}",
        *compare(args, cfg, model, tok),
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
