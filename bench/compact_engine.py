"""The tiny compact seller's decoding: its own hand-written loop (``nego.agents.compact.protocol.generate_turns``)
against the in-process generation engine that chat models use (``nego.agents.llm.backends.hf_engine.GenerationEngine``,
both of its paths), on the same model and the same work.

Workload: the rollouts of one GRPO step of the default ``nego train`` run. The tiny model (word vocabulary, the
1.65M-parameter Qwen2 shape) is built from scratch; 64 negotiations (8 scenarios x groups of 8) each take 8 turns;
a turn continues every negotiation's context by at most 6 words (a 4-issue offer plus ``offer`` and ``<eot>``),
sampled at temperature 1 from each negotiation's own generator, then appends 8 environment words (the other side's
offer, utilities, rounds left) before the next turn. Contexts start at the 6-word header. Every arm generates the
same number of tokens per turn (every arm stops only at an id the model cannot write), so the arms do the same
work. One torch thread; the arms alternate, and each repeat builds a fresh
engine (an engine keeps the prompt states of one policy version, as in training).

    python bench/compact_engine.py                    # 5 repeats
    python bench/compact_engine.py --out bench/results/compact_engine.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROWS, TURNS, NEW, ENV, HEADER = 64, 8, 6, 8, 6


def workload(vocab: int, seed: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Start contexts and, per turn, the environment words appended after each row's reply."""
    import numpy as np

    rng = np.random.default_rng(seed)
    starts = rng.integers(5, vocab, size=(ROWS, HEADER)).tolist()
    env = [rng.integers(5, vocab, size=(ROWS, ENV)).tolist() for _ in range(TURNS)]
    return starts, env


def run_loop(model, starts, env, pad_id: int, never: int) -> tuple[float, list[list[int]]]:
    """The compact protocol's own loop: every turn re-reads each context in one padded forward pass."""
    import torch
    from nego.agents.compact.protocol import _Request, generate_turns

    contexts = [list(s) for s in starts]
    gens = [torch.Generator().manual_seed(i) for i in range(ROWS)]
    t0 = time.perf_counter()
    for turn in range(TURNS):
        batch = [_Request(c, NEW, 1.0, g, None) for c, g in zip(contexts, gens, strict=True)]
        out = generate_turns(model, batch, pad_id=pad_id, stop_id=never)
        contexts = [c + ids + env[turn][i] for i, (c, (ids, _)) in enumerate(zip(contexts, out, strict=True))]
    return time.perf_counter() - t0, contexts


def run_engine(model, starts, env, pad_id: int, split: bool, never: int) -> tuple[float, list[list[int]], dict]:
    """The chat models' engine: the read-alone, decode-together path (reusing earlier turns' prompt states) or one
    left-padded ``generate`` call per turn."""
    from nego.agents.llm.backends.hf_engine import GenerationEngine, Row

    engine = GenerationEngine(model, eos_ids=(never,), pad_id=pad_id, split_prefill=split, prefill_chunk=16)
    contexts = [list(s) for s in starts]
    t0 = time.perf_counter()
    for turn in range(TURNS):
        out = engine.generate([Row(c, NEW, 1.0, 1000 * turn + i) for i, c in enumerate(contexts)])
        contexts = [c + list(g.ids) + env[turn][i] for i, (c, g) in enumerate(zip(contexts, out, strict=True))]
    stats = {"prefill_s": engine.stats.prefill_s, "decode_s": engine.stats.decode_s}
    return time.perf_counter() - t0, contexts, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch
    from nego.training.tiny_model import build_tiny_model, parameter_count
    from nego.training.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_tiny_model(tok).eval()
    pad = tok.pad_token_id
    arms = {"hand-written loop (compact)": [], "engine, split path": [], "engine, generate path": []}
    detail: dict[str, list[dict]] = {k: [] for k in arms}
    with torch.inference_mode():
        for rep in range(args.repeat):
            starts, env = workload(len(tok), rep)
            seconds, _ = run_loop(model, starts, env, pad, len(tok))
            arms["hand-written loop (compact)"].append(seconds)
            for name, split in (("engine, split path", True), ("engine, generate path", False)):
                seconds, _, stats = run_engine(model, starts, env, pad, split, len(tok))
                arms[name].append(seconds)
                detail[name].append(stats)
    base = statistics.median(arms["hand-written loop (compact)"])
    lines = [
        f"$ python bench/compact_engine.py --repeat {args.repeat}",
        f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, torch {torch.__version__}, 1 thread",
        f"tiny model {parameter_count(model) / 1e6:.2f}M parameters; {ROWS} negotiations x {TURNS} turns x {NEW} "
        f"new tokens, {ENV} environment tokens per turn",
        f"{'arm':32} {'median s':>9} {'vs loop':>8}   runs (s)",
    ]
    for name, runs in arms.items():
        med = statistics.median(runs)
        lines.append(f"{name:32} {med:9.3f} {med / base:7.2f}x   " + " ".join(f"{r:.3f}" for r in runs))
    for name, stats in detail.items():
        if stats:
            pre = statistics.median(s["prefill_s"] for s in stats)
            dec = statistics.median(s["decode_s"] for s in stats)
            lines.append(f"  {name}: prefill {pre:.3f} s, decode {dec:.3f} s (medians)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
