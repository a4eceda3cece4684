"""Batch invariance of the in-process models: whether a negotiation (the compact tiny seller) or a row (the chat
engine) comes out the same whatever it is batched with, how far a row's batched logits are from its logits read
alone, how often a choice is made again alone, and what the new token choice costs against the old one.

Token choice, three ways (the code under test is switched in this process, nothing else changes):

- ``old``: as before this check existed: the compact seller's rows draw their noise at every step of their batch,
  finished or not; every choice is made on the batched logits;
- ``draws``: noise drawn only for the tokens a row chooses, every choice still made on the batched logits: what
  float rounding alone does;
- ``new``: the code as it stands: those draws, and a close race decided again on the row read alone
  (:mod:`nego.agents.token_choice`).

Compact: a warm-started tiny model (``--warm DIR``, behaviour-cloned there briefly when empty) plays the first
``--scenarios`` dev scenarios against three buyers at temperature 0.7, one negotiation at a time (concurrency 1), all
together, beside two rule sellers on the same slots, and in reverse order at concurrency 7; each arm counts the
negotiations whose turns or outcome differ from the concurrency-1 play of the same choice. The all-together play is
also timed, old and new alternating. Chat: a random Llama (``bench/batching.py``'s model, hidden 256, 4 layers)
continues ``--rows`` rendered negotiation prompts by 64 sampled tokens, on each generation path (prompts read alone
and decoded together; one left-padded ``generate``): each row alone, all together, in reverse order and in two
halves; rows that differ from their lone generation are counted, and the all-together call is timed old and new.

    python bench/batch_invariance.py --warm /tmp/tiny-warm --out bench/results/batch_invariance.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BUYERS = ("tft", "timedep:e=1", "hazard")
TEMPERATURE = 0.7


def warm_model(path: Path):
    """The tiny model behaviour-cloned on rule sellers (150 steps), saved at ``path``; loaded if already there."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    if not (path / "config.json").exists():
        from nego.training.config import TrainConfig
        from nego.training.pool import BuyerPool
        from nego.training.rollout import split_scenarios
        from nego.training.sft import behaviour_clone, record_transcripts
        from nego.training.tiny_model import build_tiny_model
        from nego.training.tokenizer import build_tokenizer

        cfg = TrainConfig()
        pool = BuyerPool(tuple(cfg.train_buyers)).rules()
        traces = record_transcripts(split_scenarios("train", 64, cfg.max_rounds), 256, cfg.sft_sellers, pool, 0)
        tok = build_tokenizer()
        model = build_tiny_model(tok, seed=0)
        behaviour_clone(model, tok, traces, steps=150, lr=2e-3, batch=32, seed=0, echo=lambda _: None)
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path).eval(), PreTrainedTokenizerFast.from_pretrained(path)


class OldPicker:
    """The compact seller's token choice before: every sampled row draws its noise at every step of its batch."""

    def __init__(self, batch) -> None:
        import torch

        self.temps = torch.tensor([[r.temperature or 1.0] for r in batch])
        self.sampled = [row for row, r in enumerate(batch) if r.temperature is not None]
        self.generators = [batch[row].generator for row in self.sampled]

    def __call__(self, logits, done, alone):
        import torch

        logp = torch.log_softmax(logits / self.temps, -1)
        toks = logp.argmax(-1)
        if self.sampled:
            probs = logp[self.sampled].exp()
            noise = torch.empty_like(probs)
            for i, gen in enumerate(self.generators):
                noise[i].exponential_(generator=gen)
            toks[self.sampled] = (probs / noise).argmax(-1)
        return toks.tolist(), logp.gather(1, toks[:, None])[:, 0].tolist()


def old_row_pick(self, logits, alone=None):
    """The chat engine's token choice before: the batched logits decide every row."""
    torch = self.torch
    picked = logits.argmax(dim=-1)
    if self.sampled:
        probs = torch.softmax(logits[self.sampled].float() / self.row_temperatures[self.sampled], dim=-1)
        noise = torch.empty_like(probs)
        for row, gen in enumerate(self.generators):
            noise[row].exponential_(generator=gen)
        picked[self.sampled] = (probs / noise).argmax(dim=-1)
    return picked


def use(choice: str) -> None:
    """Switch both decoders to the token choice ``choice`` (old, draws or new)."""
    from nego.agents import token_choice
    from nego.agents.compact import decode
    from nego.agents.llm.backends import hf_decoding

    decode._Picker = OldPicker if choice == "old" else NEW_PICKER
    hf_decoding.RowSampler.pick = old_row_pick if choice == "old" else NEW_PICK
    token_choice.MARGIN = 0.0 if choice == "draws" else NEW_MARGIN


def compact_play(model, tok, jobs, concurrency: int, *, rules: bool = False) -> tuple[dict, float, float]:
    from nego.agents.compact.protocol import CompactFactory, CompactPolicy
    from nego.market.marketplace import Job
    from nego.training.runner import EpisodeRunner

    extra = [Job(j.scenario, s, j.buyer, j.seed) for j in jobs for s in ("tft", "linear")] if rules else []
    factory = CompactFactory("L", CompactPolicy(model, tok), TEMPERATURE)
    wall, cpu = time.perf_counter(), time.process_time()
    with EpisodeRunner({"L": factory}, concurrency=concurrency) as runner:
        played = runner.play([*jobs, *extra])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out = {
        p.job.negotiation_id: (
            p.result.outcome,
            [(t.role, t.attempt, t.action.raw) for t in p.result.turns],
            p.seller_record.completion_ids,
            sum(p.seller_record.mask),
        )
        for p in played
        if p.job.seller == "L"
    }
    return out, wall, cpu


def compact_logit_gaps(model, tok, jobs, every: int = 7) -> tuple[float, int, int]:
    """Largest |batched - lone| logit over every ``every``-th open row-step of the all-together play, how many
    row-steps were compared, and the tokens decided again alone (a separate, uninstrumented play)."""
    from nego.agents.compact import decode

    gaps, seen, reads = [], [0], [0]
    step, alone = decode._Loop.step, decode._Loop.alone

    def measuring(self, logits):
        batched = logits.float().cpu()
        for row in range(len(self.batch)):
            if not self.done[row]:
                seen[0] += 1
                if seen[0] % every == 0:
                    gaps.append(float((alone(self, row) - batched[row]).abs().max()))
        return step(self, logits)

    def counting(self, row):
        reads[0] += 1
        return alone(self, row)

    decode._Loop.step = measuring
    compact_play(model, tok, jobs, 1024)
    decode._Loop.step, decode._Loop.alone = step, counting
    compact_play(model, tok, jobs, 1024)
    decode._Loop.alone = alone
    return max(gaps), len(gaps), reads[0]


def compact_report(args) -> list[str]:
    from nego.market.marketplace import Job
    from nego.training.rollout import split_scenarios

    model, tok = warm_model(args.warm)
    scenarios = split_scenarios("dev", args.scenarios, 10)
    jobs = [Job(sc, "L", b, 1000 + i) for i, sc in enumerate(scenarios) for b in BUYERS]
    lines = [f"compact: {len(jobs)} negotiations (dev split x {', '.join(BUYERS)}), temperature {TEMPERATURE}"]
    lines.append(f"{'choice':<8}{'together':>10}{'beside rules':>14}{'reversed, c=7':>15}   (negotiations differing)")
    for choice in ("old", "draws", "new"):
        use(choice)
        alone, _, _ = compact_play(model, tok, jobs, 1)
        arms = [compact_play(model, tok, jobs, 1024)[0], compact_play(model, tok, jobs, 1024, rules=True)[0]]
        arms.append(compact_play(model, tok, jobs[::-1], 7)[0])
        counts = [sum(arm[k][:3] != alone[k][:3] for k in alone) for arm in arms]
        lines.append(f"{choice:<8}{counts[0]:>10}{counts[1]:>14}{counts[2]:>15}")
    use("new")
    gap, compared, reads = compact_logit_gaps(model, tok, jobs)
    tokens = sum(own for *_, own in compact_play(model, tok, jobs, 1024)[0].values())
    lines.append(
        f"largest |batched - lone| logit over {compared} row-steps: {gap:.2e} ({gap / TEMPERATURE:.2e} after / T; "
        f"the margin's half is {NEW_MARGIN / 2:g}); {reads} of {tokens} tokens ({reads / tokens:.2%}) decided again "
        "alone"
    )
    lines += timing([(c, lambda: compact_play(model, tok, jobs, 1024)[1:]) for c in ("old", "new")], args.repeats)
    return lines


def timing(arms, repeats: int) -> list[str]:
    """Run each (choice, fn -> (wall, cpu)) ``repeats`` times, alternating; each choice's medians against old's."""
    seen: dict[str, list[tuple[float, float]]] = {c: [] for c, _ in arms}
    for _ in range(repeats):
        for choice, fn in arms:
            use(choice)
            seen[choice].append(fn())
    use("new")
    wall = {c: statistics.median(w for w, _ in v) for c, v in seen.items()}
    cpu = {c: statistics.median(x for _, x in v) for c, v in seen.items()}
    return [
        f"all together, median of {repeats}: "
        + "; ".join(
            f"{c} {wall[c]:.2f} s wall / {cpu[c]:.2f} s CPU"
            + ("" if c == "old" else f" ({wall[c] / wall['old']:.3f}x / {cpu[c] / cpu['old']:.3f}x old)")
            for c in seen
        )
    ]


def chat_logit_gap(engine, rows, every: int = 5) -> tuple[float, int]:
    """Largest |batched - lone| logit over every ``every``-th row-step of one all-together call, and how many were
    compared (the lone reads made for it are not counted as decisions)."""
    from nego.agents.llm.backends import hf_decoding

    gaps, seen, pick = [], [0], hf_decoding.RowSampler.pick

    def measuring(self, logits, alone=None):
        for row in range(len(logits) if alone is not None else 0):
            seen[0] += 1
            lone = alone(row) if seen[0] % every == 0 else None
            if lone is not None:
                gaps.append(float((lone.float() - logits[row].float()).abs().max()))
        return pick(self, logits, alone)

    hf_decoding.RowSampler.pick = measuring
    try:
        engine.generate(rows)
    finally:
        hf_decoding.RowSampler.pick = pick
    return max(gaps), len(gaps)


def chat_report(args) -> list[str]:
    import torch
    from batching import Shape, build_model, sample_prompts
    from nego.agents.llm.backends.base import ChatMessage
    from nego.agents.llm.backends.hf import HFBackend, chat_ids
    from nego.agents.llm.backends.hf_engine import Row
    from nego.agents.llm.prompts import DEFAULT_TEMPLATE, load_template
    from nego.market.types import Observation
    from nego.scenarios.generator import generate_scenarios
    from nego.scenarios.scenario import Role

    template = load_template(DEFAULT_TEMPLATE)
    scenarios = generate_scenarios(args.rows, seed=11)
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp), sample_prompts(scenarios, template.name), Shape(256, 4, 8, 2, 688))
        backend = HFBackend.from_spec(tmp, device="cpu")
    engine, tok = backend.engine, backend.tokenizer
    prompts = []
    for sc in scenarios:
        obs = Observation(sc.view_for(Role.SELLER), (), 1, None)
        messages = tuple(ChatMessage(m.role, m.content) for m in template.render(obs, tools=False))
        prompts.append(chat_ids(tok, messages))
    rows = [Row(p, 64, (0.7, 1.0)[i % 2], 50 + i) for i, p in enumerate(prompts)]
    engine.eos_ids = (len(tok) + 1,)  # every row writes its 64 tokens
    lengths = sorted(len(p) for p in prompts)
    lines = [f"chat engine: {len(rows)} rows of {lengths[0]}-{lengths[-1]} prompt tokens, 64 sampled tokens each"]

    def together():
        wall, cpu = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            engine.generate(rows)
        return time.perf_counter() - wall, time.process_time() - cpu

    for path in ("split", "generate"):
        engine.split_prefill = path == "split"
        lines.append(f"{path} path")
        lines.append(f"  {'choice':<8}{'together':>10}{'reversed':>10}{'halves':>8}   (rows differing from alone)")
        for choice in ("old", "draws", "new"):
            use(choice)
            alone = [engine.generate([r])[0].ids for r in rows]
            half = len(rows) // 2
            arms = [engine.generate(rows), engine.generate(rows[::-1])[::-1]]
            arms.append(engine.generate(rows[:half]) + engine.generate(rows[half:]))
            counts = [sum(g.ids != a for g, a in zip(arm, alone, strict=True)) for arm in arms]
            lines.append(f"  {choice:<8}{counts[0]:>10}{counts[1]:>10}{counts[2]:>8}")
        use("new")
        gap, compared = chat_logit_gap(engine, rows)
        before, draws = engine.stats.lone_reads, 4
        for k in range(draws):  # the rate over four times the tokens: the same rows with other seeds
            engine.generate([Row(r.ids, r.max_new, r.temperature, 1000 * k + i) for i, r in enumerate(rows)])
        reads, tokens = engine.stats.lone_reads - before, 64 * len(rows) * draws
        lines.append(
            f"  largest |batched - lone| logit over {compared} row-steps: {gap:.2e}; {reads} of {tokens} tokens "
            f"({reads / tokens:.2%}) decided again alone"
        )
        lines += ["  " + line for line in timing([(c, together) for c in ("old", "draws", "new")], args.repeats)]
    return lines


def main() -> None:
    global NEW_PICKER, NEW_PICK, NEW_MARGIN
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warm", type=Path, required=True, help="the warm-started tiny model (built there if empty)")
    ap.add_argument("--scenarios", type=int, default=24, help="dev scenarios the compact seller plays")
    ap.add_argument("--rows", type=int, default=16, help="prompts the chat engine continues")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each choice, alternating")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch
    from nego.agents import token_choice
    from nego.agents.compact import decode
    from nego.agents.llm.backends import hf_decoding

    torch.set_num_threads(1)
    NEW_PICKER, NEW_PICK, NEW_MARGIN = decode._Picker, hf_decoding.RowSampler.pick, token_choice.MARGIN
    lines = [
        "# batch invariance of in-process models: old and new token choice in the same run",
        f"command: python bench/batch_invariance.py {' '.join(sys.argv[1:])}",
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"torch {torch.__version__}, 1 thread, float32",
        "",
        *compact_report(args),
        "",
        *chat_report(args),
    ]
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.out is not None:
        args.out.write_text(report)


NEW_PICKER = NEW_PICK = NEW_MARGIN = None

if __name__ == "__main__":
    main()
