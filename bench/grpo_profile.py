"""Where a GRPO step of the tiny seller spends its time, and how many steps a CPU-minute buys before and after
the kept KV cache.

A tiny model is warm-started briefly (or loaded from ``--warm DIR``, which the first run fills), then trains with the
wiring of ``nego train``: ``grpo.open_runner`` + ``grpo.build_trainer`` (market rollouts with Parquet transcripts,
TRL's ``GRPOTrainer`` with the ``grpo_args`` of a real run, 8 scenarios x 8 negotiations per step).

- default: ``--steps`` GRPO steps per path and thread count under cProfile with a CPU-time clock; prints CPU
  seconds per step by component (the rollout split into model forwards, sampling, the compact words, the buyers,
  transcripts and the market around them; TRL's batch preparation, loss forward, backward, optimizer, logging).
- ``--compare``: both paths train from the same warm model with the same seeds, alternating in blocks of ``--steps``
  steps (each block a fresh trainer), no profiler; prints GRPO steps per CPU-minute and per wall-minute, and
  whether both paths saw the same rewards (they play the same tokens).
- ``--warm-start``: the warm start of a default ``nego train``: recording its rule-seller transcripts, and its
  behaviour-cloning steps in both paths (alternating blocks of ``--bc-steps``), projected to the default steps.

Paths: ``new`` is the code as it stands; ``old`` re-reads each negotiation's whole context every turn
(``CompactPolicy(keep_cache=False)``: the decoding loop as it was before the kept cache) and reads every
behaviour-cloning batch in one pass padded to its longest row (``behaviour_clone(by_length=False)``).

    python bench/grpo_profile.py --threads 1,2 --paths old,new --out bench/results/grpo_profile.txt
    python bench/grpo_profile.py --compare --threads 1 --out bench/results/grpo_speed.txt
"""

from __future__ import annotations

import argparse
import copy
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Key = tuple[str, int, str]
COMPACT_WORDS = {
    "act",
    "record",
    "observe",
    "finish",
    "add",
    "parse_action",
    "level_offer",
    "offer_levels",
    "utility_words",
    "header_words",
    "action_words",
    "end_words",
    "rounds_word",
    "token_trace",
    "generate",
    "submit",
    "new_cache",
}


def _in(path: str) -> Callable[[Key], bool]:
    return lambda k: k[0].replace(os.sep, "/").endswith(path)


def _fn(path: str, *names: str) -> Callable[[Key], bool]:
    inside = _in(path)
    return lambda k: inside(k) and k[2] in names


def _any(*preds: Callable[[Key], bool]) -> Callable[[Key], bool]:
    return lambda k: any(p(k) for p in preds)


ROLLOUT = _fn("training/rollout.py", "__call__")
GENERATION = _fn("agents/compact/decode.py", "generate_turns")
SAMPLING = _fn("agents/compact/decode.py", "step")
ROLLOUT_PARTS = [
    ("sampling (per-row draws, log-probs)", SAMPLING),
    ("compact words (trace, parse, ids)", _fn("agents/compact/protocol.py", *COMPACT_WORDS)),
    (
        "buyers (rule agents)",
        lambda k: k[2] == "act" and "/agents/" in k[0] and not k[0].endswith("compact/protocol.py"),
    ),
    ("transcripts (Parquet)", _any(_in("market/transcripts.py"), _in("market/transcript_rows.py"))),
]
TRL_PARTS = [
    ("loss forward", _fn("trl/trainer/grpo_trainer.py", "compute_loss")),
    ("backward", _fn("accelerate/accelerator.py", "backward")),
    ("optimizer, grad clipping", lambda k: "/torch/optim/" in k[0] or k[0].endswith("clip_grad.py")),
    (
        "logging, callbacks, checkpoint",
        _any(
            _fn("transformers/trainer.py", "_maybe_log_save_evaluate"),
            _in("transformers/trainer_callback.py"),
            _in("training/train_log.py"),
        ),
    ),
]


def inclusive(stats: pstats.Stats, pred: Callable[[Key], bool]) -> float:
    """Seconds spent inside the functions ``pred`` selects, entered from outside them (no double counting of
    calls among them)."""
    total = 0.0
    for key, (_, _, _, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if pred(key):
            total += sum(c[3] for caller, c in callers.items() if not pred(caller))
    return total


def calls(stats: pstats.Stats, pred: Callable[[Key], bool]) -> int:
    return sum(v[1] for k, v in stats.stats.items() if pred(k))  # type: ignore[attr-defined]


def split(stats: pstats.Stats, steps: int) -> list[tuple[str, float]]:
    """CPU seconds per step by component; nested parts are indented and their parent keeps the rest."""
    total = stats.total_tt  # type: ignore[attr-defined]
    rollout = inclusive(stats, ROLLOUT)
    generation = inclusive(stats, GENERATION)
    parts = {name: inclusive(stats, pred) for name, pred in ROLLOUT_PARTS}
    prep = inclusive(stats, _fn("trl/trainer/grpo_trainer.py", "_generate_and_score_completions")) - rollout
    trl = {name: inclusive(stats, pred) for name, pred in TRL_PARTS}
    sampling = parts["sampling (per-row draws, log-probs)"]
    rows = [("rollout (64 negotiations through the market)", rollout)]
    rows.append(("  model forwards, caches (generation)", generation - sampling))
    rows += [(f"  {name}", value) for name, value in parts.items()]
    rows.append(("  market, protocol, event loop (rest)", rollout - generation - sum(parts.values()) + sampling))
    rows.append(("TRL batch preparation (padding, rewards)", prep))
    rows += list(trl.items())
    rows.append(("other", total - rollout - prep - sum(trl.values())))
    rows.append(("total", total))
    return [(name, value / steps) for name, value in rows]


# --------------------------------------------------------------------------------------------------- the set-up


def config(args: argparse.Namespace):
    from nego.training.config import TrainConfig

    return TrainConfig(
        steps=args.steps,
        eval_every=0,
        save_every=0,
        time_budget_min=0,
        sft_episodes=args.sft_episodes,
        sft_steps=args.sft_steps,
        train_scenarios=256,
        temperature=1.0,  # the temperature its results were measured at
    ).validate()


def warm_model(cfg, warm: str) -> tuple[Any, Any, str]:
    from nego.training.sanity import warm_start
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    if warm and (Path(warm) / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(warm)
        note = (Path(warm) / "warm_start.txt").read_text().strip()
        return model, PreTrainedTokenizerFast.from_pretrained(warm), f"{note} (saved in {warm} by an earlier run)"
    t0 = time.process_time()
    model, tok, loss = warm_start(cfg)
    note = (
        f"warm-started on {cfg.sft_episodes} episodes, {cfg.sft_steps} SFT steps (seed {cfg.seed}), "
        f"loss {loss:.3f}, {time.process_time() - t0:.0f} CPU s"
    )
    if warm:
        model.save_pretrained(warm)
        tok.save_pretrained(warm)
        (Path(warm) / "warm_start.txt").write_text(note + "\n")
    return model, tok, note


class Measured:
    """What a path's rollouts looked like: rewards per step, tokens of the episodes, what TRL pads them to, and
    the context tokens a turn reads when it re-reads everything (the kept cache reads each token once)."""

    def __init__(self) -> None:
        self.rewards: list[list[float]] = []
        self.tokens = self.padded = self.reread = self.asks = 0


def rollout_cls(path: str, seen: Measured):
    from nego.agents.compact.protocol import CompactFactory, CompactPolicy
    from nego.training.rollout import MarketRollout

    class BenchRollout(MarketRollout):
        def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
            out = super().__call__(prompts, trainer)
            seen.rewards.append(list(out["reward"]))
            widths = [len(p) for p in out["prompt_ids"]], [len(c) for c in out["completion_ids"]]
            seen.tokens += sum(widths[0]) + sum(widths[1])
            seen.padded += len(out["reward"]) * (max(widths[0]) + max(widths[1]))
            most = 0
            for prompt, mask in zip(out["prompt_ids"], out["env_mask"], strict=True):
                starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
                seen.reread += sum(len(prompt) + i for i in starts)
                most = max(most, len(starts))
            seen.asks += most  # the fewest batched calls a step can take: its longest negotiation's requests
            return out

        def learner(self, model: Any, trainer: Any):
            policy = CompactPolicy(model, self.tokenizer, keep_cache=path == "new")
            return CompactFactory(self.spec, policy, float(trainer.temperature))

    return BenchRollout


def run_block(cfg, model, tok, path: str, seen: Measured, profile: bool) -> tuple[float, float, Any]:
    """Train a copy of ``model`` for ``cfg.steps`` steps on ``path``; (CPU s, wall s, cProfile or None)."""
    import cProfile

    from nego.training import grpo

    with tempfile.TemporaryDirectory() as tmp, grpo.open_runner(cfg, Path(tmp)) as runner:
        parts = grpo.build_trainer(
            cfg,
            copy.deepcopy(model),
            tok,
            Path(tmp),
            lambda s: None,
            time.perf_counter(),
            runner,
            rollout_cls=rollout_cls(path, seen),
            observer=_Quiet(),
        )
        prof = cProfile.Profile(time.process_time) if profile else None
        c0, w0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        parts.trainer.train()
        if prof is not None:
            prof.disable()
        return time.process_time() - c0, time.perf_counter() - w0, prof


class _Quiet:
    """An observer, so that the trainer's progress bar and log printing are off (as under the live view)."""

    def on_step(self, row: Any) -> None:
        pass

    def on_dev(self, dev: Any) -> None:
        pass


# --------------------------------------------------------------------------------------------------- the modes


def profile_mode(args, cfg, model, tok) -> list[str]:
    import torch

    lines = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for path in args.paths:
            seen = Measured()
            cpu, wall, prof = run_block(cfg, model, tok, path, seen, profile=True)
            stats = pstats.Stats(prof)
            steps = cfg.steps
            lines.append(
                f"\n== path {path}, torch threads {threads}: {steps} steps, {cpu / steps:.2f} CPU s and "
                f"{wall / steps:.2f} wall s per step under the profiler"
            )
            lines.append(f"{'component':<46} {'CPU s/step':>10} {'share':>6}")
            rows = split(stats, steps)
            total = rows[-1][1]
            lines += [f"{name:<46} {value:>10.3f} {value / total:>6.1%}" for name, value in rows]
            gen_calls = calls(stats, GENERATION) / steps
            trl_forwards = calls(stats, _fn("trl/trainer/grpo_trainer.py", "_get_per_token_logps_and_entropies"))
            lines.append(
                f"per step: {gen_calls:.1f} batched generation calls (the longest negotiation asks "
                f"{seen.asks / steps:.1f} times), {trl_forwards / steps:.0f} TRL forward; the "
                f"episodes hold {seen.tokens / steps:.0f} "
                f"tokens, TRL pads them to {seen.padded / steps:.0f} ({seen.padded / seen.tokens:.2f}x); re-reading "
                f"every turn's context reads {seen.reread / steps:.0f} ({seen.reread / seen.tokens:.1f}x), the kept "
                "cache each token once"
            )
    return lines


def compare_mode(args, cfg, model, tok) -> list[str]:
    import numpy as np
    import torch

    lines = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        cpu: dict[str, list[float]] = {p: [] for p in ("old", "new")}
        wall: dict[str, list[float]] = {p: [] for p in ("old", "new")}
        seen = {p: Measured() for p in ("old", "new")}
        for _ in range(args.repeats):
            for path in ("old", "new"):
                c, w, _ = run_block(cfg, model, tok, path, seen[path], profile=False)
                cpu[path].append(c / cfg.steps)
                wall[path].append(w / cfg.steps)
        old_c, new_c = np.array(cpu["old"]), np.array(cpu["new"])
        old_w, new_w = np.array(wall["old"]), np.array(wall["new"])
        same = seen["old"].rewards == seen["new"].rewards
        pairs = zip(seen["old"].rewards, seen["new"].rewards, strict=True)
        gap = max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True))
        lines += [
            f"\n== torch threads {threads}: {args.repeats} blocks of {cfg.steps} GRPO steps per path, alternating",
            f"old: {old_c.mean():.2f} CPU s, {old_w.mean():.2f} wall s per step "
            f"(blocks {', '.join(f'{x:.2f}' for x in old_c)} CPU)",
            f"new: {new_c.mean():.2f} CPU s, {new_w.mean():.2f} wall s per step "
            f"(blocks {', '.join(f'{x:.2f}' for x in new_c)} CPU)",
            f"steps per CPU-minute:  old {60 / old_c.mean():.1f}, new {60 / new_c.mean():.1f}, "
            f"ratio {old_c.mean() / new_c.mean():.2f}x (blocks {_ratios(old_c, new_c)})",
            f"steps per wall-minute: old {60 / old_w.mean():.1f}, new {60 / new_w.mean():.1f}, "
            f"ratio {old_w.mean() / new_w.mean():.2f}x",
            f"same rewards on both paths, step by step: {same} (largest difference {gap:.2g})",
        ]
    return lines


def _ratios(old: Any, new: Any) -> str:
    return ", ".join(f"{a / b:.2f}" for a, b in zip(old, new, strict=True))


def warm_start_mode(args, cfg) -> list[str]:
    import numpy as np
    import torch
    from nego.training.config import TrainConfig
    from nego.training.pool import BuyerPool
    from nego.training.rollout import split_scenarios
    from nego.training.sft import behaviour_clone, record_transcripts
    from nego.training.tiny_model import build_tiny_model
    from nego.training.tokenizer import build_tokenizer

    full = TrainConfig().kind.resolve(TrainConfig())
    scenarios = split_scenarios("train", full.train_scenarios, full.max_rounds)
    c0, w0 = time.process_time(), time.perf_counter()
    traces = record_transcripts(scenarios, full.sft_episodes, full.sft_sellers, BuyerPool(tuple(full.train_buyers)), 0)
    rec_c, rec_w = time.process_time() - c0, time.perf_counter() - w0
    tok = build_tokenizer()
    base = build_tiny_model(tok, seed=0)
    lines = [
        f"\n== the warm start of a default run: {full.sft_episodes} rule-seller transcripts recorded in "
        f"{rec_c:.1f} CPU s ({rec_w:.1f} wall s; recording has no old path: the figure counts for both)"
    ]
    for threads in args.threads:
        torch.set_num_threads(threads)
        per: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):
            for by_length in (False, True):
                model = copy.deepcopy(base)
                c0 = time.process_time()
                behaviour_clone(
                    model,
                    tok,
                    traces,
                    steps=args.bc_steps,
                    lr=full.sft_lr,
                    batch=full.sft_batch,
                    seed=0,
                    by_length=by_length,
                )
                per[by_length].append((time.process_time() - c0) / args.bc_steps)
        old, new = np.array(per[False]), np.array(per[True])
        lines += [
            f"torch threads {threads}, behaviour cloning (batch {full.sft_batch}), {args.repeats} blocks of "
            f"{args.bc_steps} steps per path: old {old.mean():.3f}, new {new.mean():.3f} CPU s per step, ratio "
            f"{old.mean() / new.mean():.2f}x (blocks {_ratios(old, new)})",
            f"  the default {full.sft_steps} steps plus recording: old {rec_c + full.sft_steps * old.mean():.0f}, new "
            f"{rec_c + full.sft_steps * new.mean():.0f} CPU s",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="store_true", help="steps per CPU- and wall-minute, old vs new path")
    ap.add_argument("--warm-start", action="store_true", help="the default run's warm start, old vs new path")
    ap.add_argument("--steps", type=int, default=6, help="GRPO steps per block")
    ap.add_argument("--repeats", type=int, default=2, help="blocks per path (--compare, --warm-start)")
    ap.add_argument("--threads", default="1", help="torch thread counts, comma-separated")
    ap.add_argument("--paths", default="new", help="paths to profile, comma-separated: old, new")
    ap.add_argument("--sft-episodes", type=int, default=512, help="warm start of the trained model: episodes")
    ap.add_argument("--sft-steps", type=int, default=100, help="warm start of the trained model: SFT steps")
    ap.add_argument("--bc-steps", type=int, default=12, help="behaviour-cloning steps per block (--warm-start)")
    ap.add_argument("--warm", default="", help="load the warm-started model from DIR, or save it there")
    ap.add_argument("--out", default="", help="write the report here")
    ap.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    args = ap.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]
    args.paths = args.paths.split(",")
    if not set(args.paths) <= {"old", "new"}:
        ap.error("--paths takes old and/or new")

    from nego.agents.threads import set_threads

    set_threads(max(args.threads))
    import torch

    command = "python bench/grpo_profile.py " + " ".join(argv if argv is not None else sys.argv[1:])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"command: {command}",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average at start {load}; CPU s = this process's",
    ]
    cfg = config(args)
    if args.warm_start:
        lines += warm_start_mode(args, cfg)
    if args.compare or not args.warm_start:
        model, tok, note = warm_model(cfg, args.warm)
        lines.append(f"tiny model {note}; {cfg.scenarios_per_step} scenarios x group {cfg.group_size} per step")
        lines += compare_mode(args, cfg, model, tok) if args.compare else profile_mode(args, cfg, model, tok)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "a" if args.append else "w") as f:
            f.write(("\n" if args.append else "") + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
