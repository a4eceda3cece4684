"""One GRPO step through nego against plain TRL ``GRPOTrainer`` on the same model: CPU seconds per trained token.

Both arms train SmolLM2-135M-Instruct as shipped (no warm start), float32 on the CPU, full fine-tuning:

- nego: the trainer ``nego train --model smollm2`` assembles (its preset, ``ChatKind.start``: preflight, weights;
  ``grpo.build_trainer``: market rollouts of multi-turn negotiations against the training buyers with the kept
  prompt cache, Parquet transcripts, the step log, the loss read in length buckets), ``--group-size`` x
  ``--scenarios`` negotiations per step of at most ``--max-rounds`` rounds, each seller turn capped at
  ``--turn-tokens`` new tokens;
- TRL: ``trl.GRPOTrainer`` itself on a single-turn dataset: the first prompts of the nego arm's negotiations (as the
  chat template renders them), the same number of completions per step, ``num_generations`` equal to the group
  size, the same learning rate, loss type, beta, epsilon, sampling and gradient checkpointing as nego's GRPOConfig,
  a reward of the completion's length in characters (it varies, so advantages are nonzero), and
  ``max_completion_length`` set to the nego arm's trained tokens per completion (measured first) unless given.

A trained token is a completion token inside the loss mask (``completion_mask * tool_mask``, TRL's
``num_items_in_batch``), counted from what each trainer hands its loss. The CPU time of this process is read from
each step's start to its log line (rollout or generation, reward, loss forward and backward, optimizer, nego's log
row); checkpoints are off in both arms. Per arm: CPU s per step, trained and all (prompt + completion) tokens per
step, CPU ms per trained token, the share of the step spent generating, and the ratio nego / TRL; the first step of
each run is reported but left out of the means (warm-up). With ``--repeats`` above 1 the arms alternate.

    python bench/trl_anchor.py --steps 3 --threads 1                 # bench/results/trl_anchor.txt, about 17 minutes
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ATTEMPTS = 3
"""Tries per seller turn (``ProtocolConfig.max_retries`` + 1): the base model's prose replies are invalid."""
CAP_ROOM = 256
"""Tokens per attempt for the rendered reply, its end and the feedback or buyer message that follows."""


@dataclass
class Step:
    """One optimizer step: CPU and wall seconds, generation's share, the tokens the loss saw."""

    cpu: float = 0.0
    wall: float = 0.0
    generate_cpu: float = 0.0
    trained: int = 0
    completion: int = 0
    prompt: int = 0
    generated: int = 0
    """Tokens the policy sampled (nego: some the chat template writes back differently stay out of the loss)."""

    @property
    def all_tokens(self) -> int:
        return self.prompt + self.completion


@dataclass
class Run:
    arm: str
    steps: list[Step] = field(default_factory=list)
    setup_cpu: float = 0.0
    notes: list[str] = field(default_factory=list)

    def kept(self) -> list[Step]:
        """The steps after the first (warm-up), or the only one."""
        return self.steps[1:] or self.steps


def instrument(trainer: Any, run: Run) -> None:
    """Count what each step's loss sees and time its generation (an instance wrapper: the class stays TRL's or
    nego's own), and time each step from its start to its log line."""
    from transformers import TrainerCallback

    generate = trainer._generate_and_score_completions

    def counted(inputs: Any) -> Any:
        c0 = time.process_time()
        out = generate(inputs)
        step = run.steps[-1]
        step.generate_cpu += time.process_time() - c0
        mask = out["completion_mask"]
        loss_mask = mask * out["tool_mask"] if "tool_mask" in out else mask
        step.trained += int(loss_mask.sum())
        step.completion += int(mask.sum())
        step.prompt += int(out["prompt_mask"].sum())
        step.generated = step.generated or step.trained
        return out

    trainer._generate_and_score_completions = counted

    class Clock(TrainerCallback):
        open = False

        def on_step_begin(self, args, state, control, **kw):
            run.steps.append(Step())
            self.open = True
            self.c0, self.w0 = time.process_time(), time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if self.open and logs and "reward" in logs:
                run.steps[-1].cpu = time.process_time() - self.c0
                run.steps[-1].wall = time.perf_counter() - self.w0
                self.open = False

    trainer.add_callback(Clock())


def nego_arm(args: argparse.Namespace, work: Path) -> tuple[Run, Any, list[tuple[str, list[int]]]]:
    """``cfg.steps`` GRPO steps of the trainer ``nego train --model smollm2`` builds; returns the run, the
    trainer's GRPOConfig and the first prompt of each group's first negotiation, in the order played (rendered text
    and ids)."""
    from nego.training import grpo
    from nego.training.config import model_preset
    from nego.training.trainer import quiet_libraries

    run = Run("nego")
    c0 = time.process_time()
    cfg = replace(
        model_preset("smollm2"),
        name="trl-anchor",
        out=str(work),
        steps=args.steps,
        group_size=args.group_size,
        scenarios_per_step=args.scenarios,
        turn_tokens=args.turn_tokens,
        max_rounds=args.max_rounds,
        max_tokens=args.max_rounds * ATTEMPTS * (args.turn_tokens + CAP_ROOM),
        sft_steps=0,  # the model as shipped
        eval_every=0,
        save_every=0,
        threads=args.threads,
        seed=args.seed,
    ).validate()
    cfg = cfg.kind.resolve(cfg)
    quiet_libraries()
    lines: list[str] = []
    with grpo.open_runner(cfg, work) as runner:
        start = cfg.kind.start(cfg, work, runner, lines.append, time.perf_counter())
        overrides = {**start.trl_overrides, "save_strategy": "no"}  # no checkpoint inside the measured run
        parts = grpo.build_trainer(
            start.cfg,
            start.model,
            start.tokenizer,
            work,
            lines.append,
            time.perf_counter(),
            runner,
            trl_overrides=overrides,
        )
        trainer = parts.trainer
        instrument(trainer, run)
        prompts: list[tuple[str, list[int]]] = []
        rollout, tokenizer, policy = trainer.rollout_func, start.tokenizer, parts.rollout.policy

        def rollout_func(batch: list, t: Any) -> dict[str, list]:
            out = rollout(batch, t)
            # each group's first negotiation's first prompt, in the order played
            prompts.extend((tokenizer.decode(ids), ids) for ids in out["prompt_ids"][:: cfg.group_size])
            run.steps[-1].generated = sum(tr.sampled for tr in policy.last.traces)
            return out

        trainer.rollout_func = rollout_func
        run.setup_cpu = time.process_time() - c0
        trainer.train()
        over = sum(r.over_cap for r in parts.log.rows if getattr(r, "over_cap", None))
        stats = parts.rollout.stats
        run.notes.append(
            f"last step's rollouts: deal rate {stats.deal_rate:.2f}, invalid per seller move {stats.invalid_rate:.2f}, "
            f"episodes over the cap {over}; template {start.cfg.template_name}, episode cap {start.cfg.max_tokens}, "
            f"{start.cfg.finetune} fine-tuning"
        )
        grpo_config = trainer.args
    return run, grpo_config, prompts


def length_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    """The completion's length in characters / 100: a reward that varies, so advantages are nonzero."""
    return [len(c) / 100 for c in completions]


def trl_arm(
    args: argparse.Namespace, work: Path, nego_args: Any, prompts: list[tuple[str, list[int]]], length: int
) -> Run:
    """Plain ``trl.GRPOTrainer`` with nego's loss and sampling settings on a single-turn dataset of ``prompts``, in
    their order (``shuffle_dataset=False``: step k reads the prompts of the nego arm's step k)."""
    import torch
    from datasets import Dataset
    from nego.agents.llm.backends.smollm2 import smollm2_source
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    run = Run("TRL")
    c0 = time.process_time()
    source = smollm2_source()
    tok = AutoTokenizer.from_pretrained(source)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    same = (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "num_generations",
        "learning_rate",
        "lr_scheduler_type",
        "warmup_steps",
        "max_grad_norm",
        "beta",
        "loss_type",
        "epsilon",
        "epsilon_high",
        "temperature",
        "top_p",
        "top_k",
        "gradient_checkpointing",
        "seed",
        "data_seed",
        "scale_rewards",
        "num_iterations",
    )
    config = GRPOConfig(
        output_dir=str(work),
        max_steps=args.steps,
        max_completion_length=length,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=False,
        **{k: getattr(nego_args, k) for k in same},
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": text} for text, _ in prompts]),
        processing_class=tok,
    )
    trainer.remove_callback(PrinterCallback)  # as nego's trainer does: no metric dict printed per step
    instrument(trainer, run)
    run.setup_cpu = time.process_time() - c0
    trainer.train()
    same_ids = all(tok(text=text)["input_ids"] == ids for text, ids in prompts)
    run.notes.append(
        f"max_completion_length {length}; {len(prompts)} prompts in nego's order, the same ids as nego's: {same_ids}"
    )
    return run


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summary(runs: list[Run], first: bool = False) -> dict[str, float]:
    """Means per step over the runs' steps after the first (``first``: all steps)."""
    steps = [s for r in runs for s in (r.steps if first else r.kept())]
    cpu = mean([s.cpu for s in steps])
    return {
        "cpu": cpu,
        "wall": mean([s.wall for s in steps]),
        "generate": mean([s.generate_cpu for s in steps]),
        "trained": mean([s.trained for s in steps]),
        "generated": mean([s.generated for s in steps]),
        "all": mean([s.all_tokens for s in steps]),
        "prompt": mean([s.prompt for s in steps]),
        "ms_per_trained": 1000 * sum(s.cpu for s in steps) / max(1, sum(s.trained for s in steps)),
    }


def ratio_line(title: str, n: dict[str, float], t: dict[str, float]) -> str:
    return (
        f"{title}: {n['ms_per_trained'] / t['ms_per_trained']:.2f}x CPU per trained token (CPU per step "
        f"{n['cpu'] / t['cpu']:.2f}x, trained tokens per step {n['trained'] / t['trained']:.2f}x, all tokens per step "
        f"{n['all'] / t['all']:.2f}x)"
    )


def report(runs: dict[str, list[Run]]) -> list[str]:
    lines = []
    sums = {arm: summary(rs) for arm, rs in runs.items()}
    for arm, rs in runs.items():
        s = sums[arm]
        lines.append(
            f"{arm:>4}: {s['cpu']:.1f} CPU s/step ({s['wall']:.1f} wall s; generation {s['generate']:.1f} CPU s, "
            f"{s['generate'] / s['cpu']:.0%}), trained tokens/step {s['trained']:.0f} (generated "
            f"{s['generated']:.0f}), all tokens/step {s['all']:.0f} (prompt {s['prompt']:.0f}), "
            f"{s['ms_per_trained']:.1f} CPU ms per trained token"
        )
        for i, r in enumerate(rs):
            lines.append(f"      run {i + 1} (setup {r.setup_cpu:.0f} CPU s):")
            lines += [
                f"        step {k + 1}: {st.cpu:.1f} CPU s (generation {st.generate_cpu:.1f}), {st.trained} trained "
                f"(generated {st.generated}) / {st.all_tokens} tokens (prompt {st.prompt}), "
                f"{1000 * st.cpu / max(1, st.trained):.1f} ms per trained token"
                for k, st in enumerate(r.steps)
            ]
            lines += [f"      {n}" for n in r.notes]
    lines.append(ratio_line("ratio nego / TRL, steps after the first", sums["nego"], sums["TRL"]))
    lines.append(
        ratio_line("ratio nego / TRL, all steps", summary(runs["nego"], first=True), summary(runs["TRL"], first=True))
    )
    if len(runs["nego"]) > 1:
        pairs = [
            summary([a])["ms_per_trained"] / summary([b])["ms_per_trained"]
            for a, b in zip(runs["nego"], runs["TRL"], strict=True)
        ]
        lines.append("  per pair of runs (after the first step): " + ", ".join(f"{p:.2f}x" for p in pairs))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="GRPO steps per run (the first is left out of the means)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per arm (arms alternate)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--scenarios", type=int, default=2, help="scenarios per step (nego); prompts per step (TRL)")
    ap.add_argument("--turn-tokens", type=int, default=64, help="cap on one seller turn's new tokens (nego)")
    ap.add_argument("--max-rounds", type=int, default=1, help="rounds per negotiation (nego)")
    ap.add_argument(
        "--completion-length", type=int, default=0, help="TRL's max_completion_length; 0 = nego's trained/completion"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/trl_anchor.txt"))
    args = ap.parse_args(argv)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from nego.agents.threads import set_threads

    set_threads(args.threads)  # before torch loads
    import torch

    head = [
        f"# python bench/trl_anchor.py {shlex.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"threads {torch.get_num_threads()}, load average at start {', '.join(f'{x:.1f}' for x in os.getloadavg())}",
    ]
    print("\n".join(head), flush=True)
    runs: dict[str, list[Run]] = {"nego": [], "TRL": []}
    prompts: list[str] = []
    nego_args, length = None, args.completion_length
    with tempfile.TemporaryDirectory(prefix="nego-trl-anchor-") as tmp:
        for r in range(args.repeats):
            run, nego_args, seen = nego_arm(args, Path(tmp) / f"nego-{r}")
            runs["nego"].append(run)
            prompts = prompts or seen
            print(report_arm(run), flush=True)
            gc.collect()
            if not length:
                kept = run.kept()
                completions = args.group_size * args.scenarios * len(kept)
                length = max(1, round(sum(s.trained for s in kept) / completions))
            run = trl_arm(args, Path(tmp) / f"trl-{r}", nego_args, prompts, length)
            runs["TRL"].append(run)
            print(report_arm(run), flush=True)
            gc.collect()
    lines = [
        *head,
        f"SmolLM2-135M-Instruct as shipped (no warm start), float32, full fine-tuning, "
        f"{args.scenarios} x group {args.group_size} = {args.scenarios * args.group_size} completions per step, "
        f"{args.steps} steps per run, {args.repeats} run(s) per arm (alternating); nego: {args.max_rounds} rounds, "
        f"{args.turn_tokens} tokens per seller turn; CPU s = this process's, step start to its log line; means "
        "leave out each run's first step",
        f"GRPOConfig (both arms): loss_type {nego_args.loss_type}, beta {nego_args.beta}, epsilon {nego_args.epsilon}, "
        f"learning_rate {nego_args.learning_rate:g}, temperature {nego_args.temperature}, gradient_checkpointing "
        f"{nego_args.gradient_checkpointing}, per_device_train_batch_size {nego_args.per_device_train_batch_size} x "
        f"accumulation {nego_args.gradient_accumulation_steps}",
        *report(runs),
    ]
    print("\n".join(lines[len(head) :]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")
    return 0


def report_arm(run: Run) -> str:
    return f"{run.arm}: " + "; ".join(
        f"step {k + 1} {s.cpu:.1f} CPU s, {s.trained} trained, {s.all_tokens} all" for k, s in enumerate(run.steps)
    )


if __name__ == "__main__":
    raise SystemExit(main())
