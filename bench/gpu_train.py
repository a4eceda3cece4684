"""GRPO on a GPU with a randomly initialised Gemma 4 of a published size, through `nego train`'s own code path.

    python bench/gpu_train.py --size 4.5b --steps 3                # E4B, LoRA or full as the preflight chooses
    python bench/gpu_train.py --size 31b --layers 12 --finetune lora   # the 31B's widths at 12 of its 60 layers
    python bench/gpu_train.py --dry                                # CPU: plans and parameter counts, all sizes
    python bench/gpu_train.py --cpu-smoke --steps 1                # CPU: the same path on a 1.7M-parameter Gemma 4

The model is built from the published config (``nego.training.gemma4_shapes``, no download) as the class ``nego``
loads (``Gemma4ForConditionalGeneration``, towers included), randomly initialised in bf16 and saved with a stand-in
Gemma-style tokenizer; then ``nego.training.grpo.train`` runs ``--steps`` GRPO steps on ``hf:DIR`` with chat
rollouts against the training buyers, the layout the preflight plans (micro-batches, episode cap) and a registered
result (``NAME`` and ``NAME-rl``). A random model never writes a valid action, so every seller turn is tried
``1 + max_retries`` times at the full reply length: the episode cap is that worst case, and the rollouts are the
slowest they can be. Prints the plan, each step's time and generated tokens/s, and the peak GPU memory against the
plan's estimate.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

GPU_CLASSES = {"24 GB": 24564, "48 GB": 46068, "80 GB": 81559, "141 GB": 143771}  # MiB, as nvidia-smi reports
MiB, GiB = 2**20, 2**30


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    args = _parser().parse_args(argv)
    if args.dry:
        return dry(args)
    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(
            "error: bench/gpu_train.py trains a Gemma 4 of a published size and needs a CUDA GPU "
            "(torch.cuda.is_available() is False). On a CPU: --dry prints the plans and parameter counts, "
            "--cpu-smoke runs the same code path on a tiny Gemma 4.",
            file=sys.stderr,
        )
        return 2
    return run(args)


def _parser() -> argparse.ArgumentParser:
    from nego.training.gemma4_shapes import SHAPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SHAPES), default="4.5b", help="published Gemma 4 size (nego alias)")
    ap.add_argument("--layers", type=int, default=None, help="build only this many layers (a multiple of 5 or 6)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--finetune", choices=["auto", "lora", "full"], default="auto")
    ap.add_argument("--max-rounds", type=int, default=2, help="rounds per training negotiation")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--scenarios-per-step", type=int, default=2)
    ap.add_argument("--dev-scenarios", type=int, default=4, help="dev negotiations per buyer at start and end")
    ap.add_argument("--turn-tokens", type=int, default=0, help="cap on one seller turn's tokens (0: nego train's)")
    ap.add_argument("--train-scenarios", type=int, default=0, help="training scenarios (0: nego train's default)")
    ap.add_argument("--vllm", choices=["auto", "on", "off"], default="auto", help="auto: colocated if installed")
    ap.add_argument("--name", default="", help="registry name (default: bench-<size>)")
    ap.add_argument("--work", default="", help="directory for the checkpoint and run (default: a temporary one)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny Gemma 4 on the CPU: checks this script")
    ap.add_argument("--dry", action="store_true", help="print plans and parameter counts for every size; no GPU")
    ap.add_argument("--episodes", type=int, default=64, help="rule-seller episodes measured for the plan")
    return ap


def dry(args: argparse.Namespace) -> int:
    """Plans for every published size on every GPU class, from the configs alone (meta device)."""
    import torch
    import transformers
    import trl
    from nego.training.config import TrainConfig
    from nego.training.episode_lengths import measure_episode_lengths
    from nego.training.gemma4_shapes import SHAPES, build_config
    from nego.training.memory_model import generation_bytes, kv_cache_bytes, model_facts
    from nego.training.preflight import PreflightError, plan
    from nego.training.stand_in_tokenizer import gemma_style_tokenizer

    base = TrainConfig(model="4.5b")
    tok = gemma_style_tokenizer()
    lengths = measure_episode_lengths(
        tok, n=args.episodes, max_rounds=base.max_rounds, buyers=base.train_buyers, sellers=base.sft_sellers
    )
    print("# Preflight plans for GRPO on one GPU, from the published Gemma 4 configs (meta device, nothing downloaded)")
    print(f"command: python bench/gpu_train.py --dry --episodes {args.episodes}")
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")
    print(f"GPU classes (MiB, as nvidia-smi reports them): {GPU_CLASSES}; training config: nego train defaults")
    print(
        f"episode lengths: {lengths.source} at the default {base.max_rounds} rounds (a byte-level BPE of "
        f"{len(tok)} tokens: Gemma's own tokenizer counts differently): after the prompt {lengths.episode}; "
        f"prompt {lengths.prompt}"
    )
    for alias, shape in SHAPES.items():
        facts = model_facts(build_config(alias))
        print(
            f"\n{alias} = {shape.label} ({shape.hub_id}): {facts.model_class}, {facts.total / 1e9:.2f}B parameters "
            f"({facts.text / 1e9:.2f}B text, {facts.towers / 1e9:.2f}B vision/audio), {facts.layers} layers, "
            f"LoRA r16 all-linear {facts.lora(16) / 1e6:.1f}M"
        )
        for gpu, mib in GPU_CLASSES.items():
            cfg = replace(base, model=alias)
            try:
                p = plan(cfg, mib * MiB, facts=facts, lengths=lengths)
            except PreflightError as e:
                print(f"  {gpu}: refused: {e}")
                continue
            print(
                f"  {gpu}: {p.finetune}, max_tokens {p.max_tokens}, micro-batch {p.micro_batch} x {p.grad_accum}, "
                f"generation {p.generation_rows}/{p.generation_rows_needed} rows at once, estimated peak "
                f"{p.memory.peak / GiB:.1f} GiB of {p.budget / GiB:.1f}"
            )
    e4b = model_facts(build_config("4.5b"))
    print("\nfull plan, 4.5b on an 80 GB GPU:")
    p = plan(base, GPU_CLASSES["80 GB"] * MiB, facts=e4b, lengths=lengths)
    print(p.describe())
    row = generation_bytes(e4b, 1, p.seq_len)
    print(
        f"\nwhy generation is split: the memory model charges each prompt read through transformers the logits of "
        f"every position (an upper bound where the model takes logits_to_keep), {row / GiB:.1f} GiB per row of "
        f"{p.seq_len} tokens for E4B, against {kv_cache_bytes(e4b, 1, p.seq_len) / GiB:.2f} GiB of key-value cache"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    import torch
    from nego.training import grpo
    from nego.training.config import TrainConfig, field_default
    from nego.training.preflight import PreflightError, plan, visible_gpu_bytes

    cuda = torch.cuda.is_available() and not args.cpu_smoke
    work = Path(args.work or tempfile.mkdtemp(prefix="nego-gpu-bench-"))
    ckpt, tok, model_config, label = build_checkpoint(args, work / "model", cuda)
    use_vllm = args.vllm == "on" or (args.vllm == "auto" and cuda and vllm_serves(type(model_config).__name__))
    name = args.name or f"bench-{args.size}" + ("-smoke" if args.cpu_smoke else "")
    turn_tokens = args.turn_tokens or field_default("turn_tokens")
    cfg = TrainConfig(
        model=f"hf:{ckpt}",
        name=name,
        out=str(work / "run"),
        steps=args.steps,
        group_size=args.group_size,
        scenarios_per_step=args.scenarios_per_step,
        max_rounds=args.max_rounds,
        dev_scenarios=args.dev_scenarios,
        eval_every=0,
        save_every=0,
        threads=1 if args.cpu_smoke else 2,
        use_vllm=use_vllm,
        turn_tokens=turn_tokens,
        finetune="lora" if args.finetune == "auto" else args.finetune,
        max_tokens=worst_case_episode(tok, args.max_rounds, turn_tokens),
        **({"train_scenarios": args.train_scenarios} if args.train_scenarios else {}),
    ).validate()
    given = {"max_tokens"} | ({"finetune"} if args.finetune != "auto" else set())
    from nego.training.episode_lengths import measure_episode_lengths
    from nego.training.memory_model import model_facts

    lengths = measure_episode_lengths(
        tok, n=args.episodes, max_rounds=cfg.max_rounds, buyers=cfg.train_buyers, sellers=cfg.sft_sellers
    )
    gpu_bytes = visible_gpu_bytes() if cuda else None
    try:
        the_plan = plan(cfg, gpu_bytes, facts=model_facts(model_config), lengths=lengths, given=given)
    except PreflightError as e:
        print(f"preflight refused: {e}")
        return 3
    print(the_plan.describe(), flush=True)
    cfg = the_plan.apply(cfg)
    print(
        f"\n{label}; {cfg.finetune}; {cfg.scenarios_per_step} x {cfg.group_size} negotiations per step, "
        f"{cfg.max_rounds} rounds, episode cap {cfg.max_tokens} (a random model's worst case); "
        f"{'vLLM colocated' if use_vllm else 'transformers'} generation; {cfg.steps} GRPO steps",
        flush=True,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = grpo.train(cfg, echo=lambda s: print(s, flush=True))  # nego train's own preflight applies the plan
    wall = time.perf_counter() - t0
    report(result, wall, the_plan, cuda)
    return 0


def build_checkpoint(args: argparse.Namespace, out: Path, cuda: bool):
    """Save a randomly initialised model and the stand-in tokenizer to ``out``; returns (dir, tokenizer, config,
    description)."""
    import torch
    from nego.training.gemma4_shapes import build_config, shape_for, tiny_config
    from nego.training.stand_in_tokenizer import gemma_style_tokenizer
    from transformers import AutoModelForCausalLM

    tok = gemma_style_tokenizer()
    ids = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id}
    if args.cpu_smoke:
        config = tiny_config(len(tok), **ids)
        label = "tiny Gemma 4 (12 layers, width 64) on CPU"
    else:
        shape = shape_for(args.size)
        config = build_config(args.size, args.layers)
        for key, value in ids.items():
            setattr(config.get_text_config(), key, value)
        depth = args.layers or shape.layers
        label = f"random-init {args.size} = Gemma 4 {shape.label} shape, {depth} of {shape.layers} layers"
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if cuda else torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if cuda:
        torch.cuda.empty_cache()
    label += f", {params / 1e9:.2f}B parameters" if params >= 1e9 else f", {params / 1e6:.2f}M parameters"
    print(f"built and saved {label} to {out} in {time.perf_counter() - t0:.0f}s", flush=True)
    return out, tok, config, label


def vllm_serves(config_class: str) -> bool:
    """True when vLLM is installed and knows the architecture the checkpoint will declare."""
    if importlib.util.find_spec("vllm") is None:
        return False
    arch = config_class.removesuffix("Config") + "ForConditionalGeneration"
    try:
        from vllm import ModelRegistry

        return arch in ModelRegistry.get_supported_archs()
    except Exception as e:  # an installed but broken vLLM (CUDA or torch mismatch) must not stop the benchmark
        print(f"vLLM is installed but unusable here ({type(e).__name__}: {e}); generating with transformers")
        return False


def worst_case_episode(tok, max_rounds: int, max_new: int) -> int:
    """Tokens after the prompt when every seller attempt is an unparseable reply of the full reply length
    (``max_new``): rounds x attempts x (reply + EOS + the feedback message that follows it)."""
    from nego.agents.llm.chat_layout import CHAT_TEMPLATE
    from nego.agents.llm.parsing import parse_text
    from nego.agents.llm.prompts import load_template
    from nego.market.protocol import ProtocolConfig
    from nego.market.types import ActionKind, Observation, Offer, PublicMove
    from nego.scenarios.scenario import Role
    from nego.training.chat_rollout import user_suffix_ids
    from nego.training.rollout import split_scenarios

    attempts = 1 + ProtocolConfig().max_retries
    template = load_template(CHAT_TEMPLATE)
    update = 0
    for scenario in split_scenarios("train", 16, max_rounds):
        view = scenario.view_for(Role.SELLER)
        offer = Offer({i.name: i.options[-1] if i.options else i.high for i in scenario.issues})
        history = (PublicMove(1, Role.BUYER, ActionKind.OFFER, offer, ""),)
        feedback = parse_text("no json here", scenario.issues).error
        before = Observation(view, history, 1, offer)
        for after in (  # a retry with feedback, and a new round after the other side's offer
            Observation(view, history, 1, offer, feedback=feedback, attempt=1),
            Observation(view, (*history, PublicMove(2, Role.BUYER, ActionKind.OFFER, offer, "")), 2, offer),
        ):
            message = template.render_update(before, after, tools=False)
            update = max(update, len(user_suffix_ids(tok, message.content)))
    return max_rounds * attempts * (max_new + 1 + update)


def report(result, wall: float, the_plan, cuda: bool) -> None:
    import polars as pl
    import torch

    log = pl.read_parquet(result.run_dir / "train_log.parquet").filter(pl.col("step_seconds").is_not_null())
    generated = log["generated_tokens"].to_list()
    device = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"\nmachine: {platform.machine()}, {device}, torch {torch.__version__}")
    rows = log.select("step", "step_seconds", "rollout_seconds").rows()
    for (step, seconds, rollout), tokens in zip(rows, generated, strict=False):
        print(
            f"step {step}: {seconds:.1f} s (rollouts {rollout:.1f} s), {tokens} generated tokens, "
            f"{tokens / rollout:.0f} generated tokens/s"
        )
    steady = rows[1:] or rows
    step_s = sum(r[1] for r in steady) / len(steady)
    gen_s = sum(r[2] for r in rows)
    print(
        f"mean step (after the first) {step_s:.1f} s; generated tokens/s over all rollouts "
        f"{sum(generated[: len(rows)]) / gen_s:.0f}; whole run {wall:.0f} s ({result.steps} steps, registered "
        f"{result.base_name} and {result.rl_name})"
    )
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        estimate = the_plan.memory.peak
        print(
            f"peak GPU memory: {peak / GiB:.1f} GiB allocated, {torch.cuda.max_memory_reserved() / GiB:.1f} GiB "
            f"reserved; the plan estimated {estimate / GiB:.1f} GiB (measured / estimated = {peak / estimate:.2f})"
        )


if __name__ == "__main__":
    raise SystemExit(main())
