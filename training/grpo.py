"""The training pipeline: the policy kind's starting model, GRPO through TRL's ``rollout_func`` hook, checkpoints,
log, registration."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nego.agents.model_registry import ModelEntry, nego_home, register
from nego.agents.threads import set_threads
from nego.market.events import EventBus
from nego.market.locks import exclusive_run
from nego.market.marketplace import Scorer

from .checkpoints import CUT_SHORT, checkpoint_step, latest_checkpoint
from .config import DEV_BUYERS, TrainConfig, no_deal_value
from .evaluate import DEV_ARM, DevEvaluation, evaluate
from .free_memory import release_freed_memory
from .policy_kind import Echo
from .pool import BuyerPool
from .rewards import outcome_scorer
from .rollout import TRAIN_ARM, MarketRollout, split_scenarios, trl_reward
from .runner import EpisodeRunner
from .train_log import StepRow, TrainLog, TrainObserver
from .trainer import build_grpo_trainer, grpo_args, lora_config, quiet_libraries, step_monitor

"""Dev evaluation buyers: every training family at fixed parameters (never a held-out one)."""
TRANSCRIPTS = "transcripts"


@dataclass(frozen=True, slots=True)
class TrainResult:
    run_dir: Path
    base_name: str
    rl_name: str
    steps: int
    stopped_early: bool
    dev: DevEvaluation
    seconds: float


@dataclass
class RunState:
    """What the trainer's callbacks keep between steps."""

    stopped_early: bool = False


@dataclass(frozen=True, slots=True)
class TrainerParts:
    """A GRPO trainer wired to the market, with the pieces around it."""

    trainer: Any
    rollout: MarketRollout
    log: TrainLog
    state: RunState


def run_dir_for(cfg: TrainConfig) -> Path:
    if cfg.resume:
        return Path(cfg.resume)
    return Path(cfg.out) if cfg.out else nego_home() / "runs" / cfg.run_name


def dev_eval(model: Any, tok: Any, cfg: TrainConfig, runner: EpisodeRunner, step: int) -> DevEvaluation:
    """Play on the dev split against the dev buyers (never the held-out suite), sampled at the rollout temperature
    with fixed seeds: the policy GRPO trains, measured the same way at every evaluation."""
    scenarios = split_scenarios("dev", cfg.dev_scenarios, cfg.max_rounds)
    spec = rl_name(cfg)
    was = model.training
    model.eval()
    factory = cfg.kind.factory(model, tok, cfg, spec)
    try:
        runner.set_learner(spec, factory)
        return evaluate(runner, spec, scenarios, DEV_BUYERS, step=step, concurrency=cfg.generation_rows)
    finally:
        model.train(was)
        forget = getattr(factory, "forget_prompts", None)  # a chat policy's stored prompt states
        if forget is not None:
            forget()
        release_freed_memory()


def rl_name(cfg: TrainConfig) -> str:
    return f"{cfg.run_name}-rl"


def open_runner(cfg: TrainConfig, run_dir: Path, scorer: Scorer | None = None, bus: EventBus | None = None):
    """The run's episode runner: transcripts under ``run_dir/transcripts``, the training reward as its scorer."""
    from nego.market.transcripts import TranscriptWriter

    writer = TranscriptWriter(run_dir / TRANSCRIPTS, flush_every=10**9)  # one part per rollout batch or evaluation
    if scorer is None:
        scorer = outcome_scorer(no_deal_value(cfg.no_deal_reward), cfg.invalid_penalty)
    return EpisodeRunner(writer=writer, bus=bus, scorer=scorer)


def roll_back_transcripts(runner: EpisodeRunner, checkpoint: Path | None) -> int:
    """Drop transcripts that a killed run wrote after the checkpoint it resumes from: rollouts of the steps it will
    play again and dev evaluations after that checkpoint (they are played again too)."""
    import polars as pl

    writer = runner.market.writer
    if writer is None:
        return 0
    n = checkpoint_step(checkpoint) if checkpoint is not None else 0
    arm = pl.col("arm")
    where = ((arm == TRAIN_ARM) & (pl.col("step") >= n)) | ((arm == DEV_ARM) & (pl.col("step") > n))
    return writer.rollback(where, f"played after step {n}, the checkpoint this run resumes from")


def build_trainer(
    cfg: TrainConfig,
    model: Any,
    tok: Any,
    run_dir: Path,
    echo: Echo,
    started: float,
    runner: EpisodeRunner,
    *,
    rollout_cls: type[MarketRollout] | None = None,
    scenarios: list | None = None,
    observer: TrainObserver | None = None,
    reward_func: Callable[..., list[float]] = trl_reward,
    trl_overrides: dict[str, Any] | None = None,
    resume_step: int | None = None,
) -> TrainerParts:
    """The GRPOTrainer wired to the market through ``runner`` (whose scorer is the reward).

    ``rollout_cls``, ``scenarios`` and ``reward_func`` replace the rollout class, the training split and TRL's reward
    function (diagnostics such as bench/grpo_sanity.py use them, with a runner scoring a reward that is known to be
    learnable, to test the same wiring). ``observer`` (a live view) sees every step; ``resume_step`` keeps the log
    rows of the steps a resumed run does not play again."""
    kind = cfg.kind
    cfg = kind.resolve(cfg)  # callers that build a trainer without train() (diagnostics, benches) included
    if scenarios is None:
        scenarios = split_scenarios("train", cfg.train_scenarios, cfg.max_rounds)
    rollout = (rollout_cls or MarketRollout)(
        scenarios,
        BuyerPool(tuple(cfg.train_buyers)),
        tok,
        runner,
        policy=kind.rollout_policy(tok, cfg),
        spec=rl_name(cfg),
        seed=cfg.seed,
        max_tokens=cfg.max_tokens,
        group_size=cfg.group_size,
        run_id=cfg.run_name,
        league_dir=run_dir / "league",
    )
    log = TrainLog(run_dir / "train_log.parquet", rollout.stats, echo, observer, resume_step=resume_step)
    state = RunState()

    def step_end(step: int, max_steps: int, model: Any, control: Any) -> None:
        if cfg.eval_every and step % cfg.eval_every == 0 and model is not None:
            dev = dev_eval(model, tok, cfg, runner, step)
            log.add_eval(dev)
            echo_dev(echo, f"step {step}: dev evaluation", dev)
        minutes = (time.perf_counter() - started) / 60
        if cfg.time_budget_min and minutes >= cfg.time_budget_min and step < max_steps:
            state.stopped_early = True
            control.should_training_stop = True
            control.should_save = True
            echo(f"time budget of {cfg.time_budget_min} min reached at step {step}: stopping")

    def on_row(row: StepRow) -> None:
        if row.step % 10 == 0 or row.step == 1:
            echo(step_line(row))

    args = grpo_args(
        cfg, run_dir / "checkpoints", gradient_checkpointing=kind.gradient_checkpointing, overrides=trl_overrides
    )
    trainer = build_grpo_trainer(
        model,
        tok,
        args,
        prompts=[s.id for s in scenarios],
        rollout_func=rollout,
        callbacks=[step_monitor(log, step_end, on_row)],
        reward_func=reward_func,
        peft_config=lora_config(cfg.lora_rank) if cfg.finetune == "lora" else None,
        pack=cfg.pack,
    )
    return TrainerParts(trainer, rollout, log, state)


def step_line(row: StepRow) -> str:
    """One logged step on one line of at most 80 columns."""
    return (
        f"step {row.step}: reward {row.reward_mean or 0:.3f} deal {row.deal_rate or 0:.2f} "
        f"invalid {row.invalid_rate or 0:.3f} entropy {row.entropy or 0:.3f} "
        f"same {row.identical_group_share or 0:.2f} {row.step_seconds:.1f}s"
    )


def echo_dev(echo: Echo, title: str, dev: DevEvaluation) -> None:
    """A dev evaluation as a title line and one line per buyer, each within 80 columns."""
    width = max(len(r.buyer) for r in dev.buyers)
    echo(title)
    echo(f"  {'dev buyer':<{width}}  utility / deal rate / invalid per episode")
    for r in dev.buyers:
        echo(f"  {r.buyer:<{width}}  {r.mean_utility:.3f} / {r.deal_rate:.2f} / {r.invalid_per_episode:.2f}")


def train(cfg: TrainConfig, echo: Echo = print, observer: TrainObserver | None = None) -> TrainResult:
    """Run (or resume) a whole training run and register ``NAME`` and ``NAME-rl``; ``observer`` sees every logged
    step and dev evaluation as it happens."""
    cfg = cfg.validate()
    cfg = cfg.kind.resolve(cfg)
    quiet_libraries()
    set_threads(cfg.threads)  # before torch loads, if it has not yet
    started = time.perf_counter()
    run_dir = run_dir_for(cfg)
    with exclusive_run(run_dir, f"nego train --name {cfg.run_name}"):
        return _train(cfg, run_dir, started, echo, observer)


def _train(cfg: TrainConfig, run_dir: Path, started: float, echo: Echo, observer: TrainObserver | None) -> TrainResult:
    bus = getattr(observer, "bus", None)
    with open_runner(cfg, run_dir, bus=bus) as runner:
        resume_from = latest_checkpoint(run_dir) if cfg.resume else None
        if cfg.resume:
            roll_back_transcripts(runner, resume_from)
        start = cfg.kind.start(cfg, run_dir, runner, echo, started)
        cfg, model, tok = start.cfg, start.model, start.tokenizer
        base_dev = dev_eval(model, tok, cfg, runner, 0)
        base_name = cfg.run_name
        entry_cfg = _entry_config(cfg, "base")
        cut = run_dir / "base" / CUT_SHORT
        if cut.exists():
            entry_cfg["cut_short"] = cut.read_text().strip()
        register(
            ModelEntry(
                base_name,
                start.source,
                "",
                cfg.kind.registry_format,
                entry_cfg,
                start.warm_start_steps,
                {"dev": base_dev.summary()},
            )
        )
        echo_dev(echo, f"registered {base_name}", base_dev)
        if observer is not None:
            observer.on_dev(base_dev)
        parts = build_trainer(
            cfg,
            model,
            tok,
            run_dir,
            echo,
            started,
            runner,
            observer=observer,
            trl_overrides=start.trl_overrides,
            resume_step=checkpoint_step(resume_from) if resume_from else None,
        )
        if resume_from:
            echo(f"resuming from {resume_from}")
        parts.trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        result = finish(cfg, parts, tok, run_dir, base_name, runner, started, echo)
    if observer is not None:
        observer.on_dev(result.dev)
    return result


def _entry_config(cfg: TrainConfig, stage: str) -> dict[str, Any]:
    """What the registry records about a run, and what its kind needs to play the model as it was trained (a chat
    model's conversation template and turn cap)."""
    out = {"stage": stage, "learning_rate": cfg.learning_rate, **{k: v for k, v in vars(cfg).items() if k != "resume"}}
    out["temperature"] = cfg.sampling_temperature  # how both models are played: the value, not "default"
    out.update(cfg.kind.registry_config(cfg))
    return out


def finish(
    cfg: TrainConfig,
    parts: TrainerParts,
    tok: Any,
    run_dir: Path,
    base_name: str,
    runner: EpisodeRunner,
    started: float,
    echo: Echo,
) -> TrainResult:
    trainer, stopped = parts.trainer, parts.state.stopped_early
    final = run_dir / "final"
    trainer.save_model(str(final))
    tok.save_pretrained(final)
    if stopped:
        trainer.save_state()
    model = trainer.accelerator.unwrap_model(trainer.model)
    steps = int(trainer.state.global_step)
    dev = dev_eval(model, tok, cfg, runner, steps)
    name = rl_name(cfg)
    entry_cfg = _entry_config(cfg, "grpo")
    if stopped:
        entry_cfg["cut_short"] = f"{steps}/{cfg.steps} GRPO steps (time_budget_min={cfg.time_budget_min:g})"
        (final / CUT_SHORT).write_text(entry_cfg["cut_short"] + "\n")
    register(
        ModelEntry(
            name,
            str(final.resolve()),
            base_name,
            cfg.kind.registry_format,
            entry_cfg,
            steps,
            {"dev": dev.summary(), "stopped_early": stopped},
        )
    )
    echo_dev(echo, f"registered {name} after {steps} GRPO steps", dev)
    if stopped:
        echo(
            f"WARNING: the time cap (time_budget_min={cfg.time_budget_min:g}) cut this run short at {steps} of "
            f"{cfg.steps} GRPO steps: {name} is not what the configured run trains (the registry says so too)"
        )
    return TrainResult(run_dir, base_name, name, steps, stopped, dev, time.perf_counter() - started)
