"""The training pipeline: warm start, GRPO through TRL's ``rollout_func`` hook, checkpoints, log, registration."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nego.agents import NegotiatorFactory
from nego.agents.model_registry import ModelEntry, nego_home, register
from nego.agents.threads import set_threads
from nego.market.events import EventBus
from nego.market.locks import exclusive_run
from nego.market.marketplace import Scorer

from .checkpoints import checkpoint_step, latest_checkpoint, save_run_config
from .config import TrainConfig, no_deal_value
from .evaluate import DEV_ARM, DevEvaluation, evaluate
from .pool import BuyerPool
from .rewards import outcome_scorer
from .rollout import TRAIN_ARM, MarketRollout, split_scenarios, trl_reward
from .runner import EpisodeRunner
from .train_log import TrainLog, TrainObserver

DEV_BUYERS = ("timedep:e=1", "tft", "timedep:e=1,patience=0.5", "reciprocal", "outside", "hazard", "deadline")
"""Dev evaluation buyers: every training family at fixed parameters (never a held-out one)."""
CUT_SHORT = "CUT_SHORT"
"""A file in a model directory whose training the time cap ended early (its text says how far it got)."""
TRANSCRIPTS = "transcripts"
Echo = Callable[[str], None]


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
    step_started: float = 0.0


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


def _env() -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def warm_start(
    cfg: TrainConfig, run_dir: Path, echo: Echo, started: float, runner: EpisodeRunner | None = None
) -> tuple[Any, Any]:
    """The tiny base model: loaded from ``run_dir/base`` if it exists, else built and behaviour-cloned there (the
    rule-seller transcripts it imitates are written through ``runner``'s transcripts, as the warm-start arm)."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from .sft import behaviour_clone, record_transcripts
    from .tiny_model import build_tiny_model, parameter_count
    from .tokenizer import build_tokenizer

    base = run_dir / "base"
    if (base / "config.json").exists():
        echo(f"warm start: reusing {base}")
        return AutoModelForCausalLM.from_pretrained(base), PreTrainedTokenizerFast.from_pretrained(base)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=cfg.seed)
    echo(f"tiny model: {parameter_count(model) / 1e6:.2f}M parameters, vocabulary {len(tok)}")
    scenarios = split_scenarios("train", cfg.train_scenarios, cfg.max_rounds)
    t0 = time.perf_counter()
    writer = runner.market.writer if runner is not None else None
    traces = record_transcripts(
        scenarios, cfg.sft_episodes, cfg.sft_sellers, BuyerPool(tuple(cfg.train_buyers)).rules(), cfg.seed, writer
    )
    echo(f"warm start: {len(traces)} rule-seller transcripts in {time.perf_counter() - t0:.1f}s")
    if cfg.sft_steps:
        # the warm start may use at most a third of the time budget, so GRPO always gets the rest
        deadline = started + cfg.time_budget_min * 20 if cfg.time_budget_min else None
        r = behaviour_clone(
            model,
            tok,
            traces,
            steps=cfg.sft_steps,
            lr=cfg.sft_lr,
            batch=cfg.sft_batch,
            seed=cfg.seed,
            deadline=deadline,
            echo=echo,
        )
        echo(f"warm start: {r.steps} SFT steps, loss {r.first_loss:.3f} -> {r.final_loss:.3f}, {r.seconds:.0f}s")
        if r.steps < cfg.sft_steps:
            echo(
                f"WARNING: the time cap (time_budget_min={cfg.time_budget_min:g}) cut the warm start short at "
                f"{r.steps} of {cfg.sft_steps} steps"
            )
            (run_dir / "base").mkdir(parents=True, exist_ok=True)
            (run_dir / "base" / CUT_SHORT).write_text(f"{r.steps}/{cfg.sft_steps} warm-start steps\n")
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return model, tok


def learner_factory(model: Any, tok: Any, cfg: TrainConfig, spec: str) -> NegotiatorFactory:
    """Negotiators of ``model`` as it is now, sampling at the rollout temperature: what GRPO trains and what the dev
    evaluation measures."""
    if cfg.is_tiny:
        from nego.agents.compact.protocol import CompactFactory, CompactPolicy

        return CompactFactory(spec, CompactPolicy(model, tok), cfg.sampling_temperature)
    from .chat_rollout import ChatFactory, ChatPolicy

    return ChatFactory(spec, ChatPolicy(model, tok, max_new=cfg.turn_tokens), cfg.sampling_temperature)


def dev_eval(model: Any, tok: Any, cfg: TrainConfig, runner: EpisodeRunner, step: int) -> DevEvaluation:
    """Play on the dev split against the dev buyers (never the held-out suite), sampled at the rollout temperature
    with fixed seeds: the policy GRPO trains, measured the same way at every evaluation."""
    scenarios = split_scenarios("dev", cfg.dev_scenarios, cfg.max_rounds)
    spec = rl_name(cfg)
    was = model.training
    model.eval()
    try:
        runner.set_learner(spec, learner_factory(model, tok, cfg, spec))
        return evaluate(runner, spec, scenarios, DEV_BUYERS, step=step)
    finally:
        model.train(was)


def rl_name(cfg: TrainConfig) -> str:
    return f"{cfg.run_name}-rl"


def grpo_args(
    cfg: TrainConfig, run_dir: Path, progress_bar: bool = True, overrides: dict[str, Any] | None = None
) -> Any:
    """TRL's GRPOConfig for ``cfg``; ``overrides`` (the preflight's micro-batch layout for a real model) win."""
    import torch
    from trl import GRPOConfig

    cpu = not torch.cuda.is_available()
    fields: dict[str, Any] = dict(
        output_dir=str(run_dir / "checkpoints"),
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.scenarios_per_step * cfg.group_size,
        num_generations=cfg.group_size,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        beta=cfg.beta,
        loss_type=cfg.loss_type,
        temperature=cfg.sampling_temperature,
        top_p=1.0,
        top_k=0,
        max_completion_length=cfg.max_tokens,
        use_cpu=cpu,
        bf16=not cpu,
        gradient_checkpointing=not cfg.is_tiny,
        logging_steps=1,
        save_strategy="steps",
        save_steps=cfg.save_every or cfg.steps,
        report_to="none",
        disable_tqdm=not progress_bar,
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
        use_vllm=cfg.use_vllm,
        vllm_mode="server" if cfg.vllm_server else "colocate",
        **({"vllm_server_base_url": cfg.vllm_server} if cfg.vllm_server else {}),
    )
    return GRPOConfig(**{**fields, **(overrides or {})})


def _callbacks(cfg: TrainConfig, log: TrainLog, tok: Any, runner: EpisodeRunner, started: float, echo: Echo):
    from transformers import TrainerCallback

    state = RunState(step_started=time.perf_counter())

    class Monitor(TrainerCallback):
        def on_step_begin(self, args, trainer_state, control, **kw):
            state.step_started = time.perf_counter()

        def on_log(self, args, trainer_state, control, logs=None, **kw):
            if logs and "reward" in logs:
                seconds = logs.get("step_time") or time.perf_counter() - state.step_started
                step = trainer_state.global_step
                row = log.add(step, logs, float(seconds))
                if step % 10 == 0 or step == 1:
                    echo(
                        f"step {step}: reward {row['reward_mean']:.3f} deal {row['deal_rate']:.2f} "
                        f"invalid {row['invalid_rate']:.3f} entropy {row['entropy'] or 0:.3f} "
                        f"identical groups {row['identical_group_share'] or 0:.2f} ({row['step_seconds']:.1f}s)"
                    )

        def on_step_end(self, args, trainer_state, control, model=None, **kw):
            step = trainer_state.global_step
            if cfg.eval_every and step % cfg.eval_every == 0 and model is not None:
                dev = dev_eval(model, tok, cfg, runner, step)
                log.add_eval(dev)
                echo(f"step {step}: dev {dev.line()}")
            minutes = (time.perf_counter() - started) / 60
            if cfg.time_budget_min and minutes >= cfg.time_budget_min and step < trainer_state.max_steps:
                state.stopped_early = True
                control.should_training_stop = True
                control.should_save = True
                echo(f"time budget of {cfg.time_budget_min} min reached at step {step}: stopping")

    return [Monitor()], state


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
    generation_rows: int | None = None,
) -> TrainerParts:
    """The GRPOTrainer wired to the market through ``runner`` (whose scorer is the reward).

    ``rollout_cls``, ``scenarios`` and ``reward_func`` replace the rollout class, the training split and TRL's reward
    function (diagnostics such as bench/grpo_sanity.py use them, with a runner scoring a reward that is known to be
    learnable, to test the same wiring). With an ``observer`` (a live view) the trainer's own progress bar and log
    printing are off: the observer shows every step instead."""
    from datasets import Dataset

    from .prompt_order import grpo_trainer_class

    if cfg.is_tiny:
        cfg = cfg.resolved_tiny()  # callers that build a trainer without train() (diagnostics, benches) included
    if scenarios is None:
        scenarios = split_scenarios("train", cfg.train_scenarios, cfg.max_rounds)
    turn_cap: dict[str, Any] = {}
    if rollout_cls is None:
        rollout_cls = MarketRollout
        if not cfg.is_tiny:
            from .chat_rollout import ChatMarketRollout as rollout_cls

            turn_cap = {"max_new": cfg.turn_tokens}
            if generation_rows is not None:  # the preflight's plan: rows one generate call may hold in memory
                turn_cap["max_rows"] = generation_rows
    rollout = rollout_cls(
        scenarios,
        BuyerPool(tuple(cfg.train_buyers)),
        tok,
        runner,
        spec=rl_name(cfg),
        seed=cfg.seed,
        max_tokens=cfg.max_tokens,
        group_size=cfg.group_size,
        run_id=cfg.run_name,
        league_dir=run_dir / "league",
        **turn_cap,
    )
    log = TrainLog(run_dir / "train_log.parquet", rollout.stats, echo, observer)
    callbacks, state = _callbacks(cfg, log, tok, runner, started, echo)
    peft_config = None
    if cfg.finetune == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    trainer = grpo_trainer_class()(
        model=model,
        reward_funcs=reward_func,
        args=grpo_args(cfg, run_dir, progress_bar=observer is None, overrides=trl_overrides),
        train_dataset=Dataset.from_list([{"prompt": s.id} for s in scenarios]),
        processing_class=tok,
        rollout_func=rollout,
        callbacks=callbacks,
        peft_config=peft_config,
    )
    if observer is not None:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return TrainerParts(trainer, rollout, log, state)


def train(cfg: TrainConfig, echo: Echo = print, observer: TrainObserver | None = None) -> TrainResult:
    """Run (or resume) a whole training run and register ``NAME`` and ``NAME-rl``; ``observer`` sees every logged
    step and dev evaluation as it happens."""
    cfg = cfg.validate()
    if cfg.is_tiny:
        cfg = cfg.resolved_tiny()
    _env()
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
        if cfg.is_tiny:
            save_run_config(run_dir, cfg)
            model, tok = warm_start(cfg, run_dir, echo, started, runner)
            base_path, sft_steps = str((run_dir / "base").resolve()), cfg.sft_steps
            trl_overrides: dict[str, Any] = {}
            generation_rows: int | None = None
        else:
            from .hf_model import load_chat_tokenizer, load_chat_weights, model_source
            from .preflight import preflight

            tok = load_chat_tokenizer(cfg)
            plan = preflight(cfg, tok, given=cfg.given)  # before any weights load: refuses what cannot fit
            echo(plan.describe())
            cfg, trl_overrides, generation_rows = plan.apply(cfg), plan.grpo_overrides(), plan.generation_rows
            model = load_chat_weights(cfg)
            save_run_config(run_dir, cfg)
            base_path, sft_steps = model_source(cfg), 0
        base_dev = dev_eval(model, tok, cfg, runner, 0)
        base_name = cfg.run_name
        entry_cfg = _entry_config(cfg, "base")
        cut = run_dir / "base" / CUT_SHORT
        if cut.exists():
            entry_cfg["cut_short"] = cut.read_text().strip()
        register(ModelEntry(base_name, base_path, "", _format(cfg), entry_cfg, sft_steps, {"dev": base_dev.summary()}))
        echo(f"registered {base_name}: dev {base_dev.line()}")
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
            trl_overrides=trl_overrides,
            generation_rows=generation_rows,
        )
        if resume_from:
            echo(f"resuming from {resume_from}")
        parts.trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        result = finish(cfg, parts, tok, run_dir, base_name, runner, started, echo)
    if observer is not None:
        observer.on_dev(result.dev)
    return result


def _format(cfg: TrainConfig) -> str:
    return "compact" if cfg.is_tiny else "hf"


def _entry_config(cfg: TrainConfig, stage: str) -> dict[str, Any]:
    """What the registry records about a run; chat models also record the conversation template they were trained on
    (name and id) and the cap on one turn's tokens, which is how they are played unless the user says otherwise."""
    out = {"stage": stage, "learning_rate": cfg.learning_rate, **{k: v for k, v in vars(cfg).items() if k != "resume"}}
    out["temperature"] = cfg.sampling_temperature  # how both models are played: the value, not "default"
    if not cfg.is_tiny:
        from .chat_rollout import layout_config

        out.update(layout_config(cfg.turn_tokens))
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
            _format(cfg),
            entry_cfg,
            steps,
            {"dev": dev.summary(), "stopped_early": stopped},
        )
    )
    echo(f"registered {name} after {steps} GRPO steps: dev {dev.line()}")
    if stopped:
        echo(
            f"WARNING: the time cap (time_budget_min={cfg.time_budget_min:g}) cut this run short at {steps} of "
            f"{cfg.steps} GRPO steps: {name} is not what the configured run trains (the registry says so too)"
        )
    return TrainResult(run_dir, base_name, name, steps, stopped, dev, time.perf_counter() - started)
