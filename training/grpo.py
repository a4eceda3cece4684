"""The training pipeline: warm start, GRPO through TRL's ``rollout_func`` hook, checkpoints, log, registration."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nego.agents.model_registry import ModelEntry, nego_home, register
from nego.agents.threads import set_threads
from nego.market.locks import exclusive_run

from .checkpoints import latest_checkpoint, save_run_config
from .config import TrainConfig, no_deal_value
from .pool import BuyerPool
from .rewards import make_reward_func
from .rollout import MarketRollout, split_scenarios
from .train_log import TrainLog, TrainObserver

DEV_BUYERS = ("timedep:e=1", "tft", "timedep:e=1,patience=0.5")
Echo = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TrainResult:
    run_dir: Path
    base_name: str
    rl_name: str
    steps: int
    stopped_early: bool
    dev: dict[str, dict[str, float]]
    seconds: float


def run_dir_for(cfg: TrainConfig) -> Path:
    if cfg.resume:
        return Path(cfg.resume)
    return Path(cfg.out) if cfg.out else nego_home() / "runs" / cfg.run_name


def _env() -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def warm_start(cfg: TrainConfig, run_dir: Path, echo: Echo, started: float) -> tuple[Any, Any]:
    """The tiny base model: loaded from ``run_dir/base`` if it exists, else built and behaviour-cloned there."""
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
    traces = record_transcripts(
        scenarios, cfg.sft_episodes, cfg.sft_sellers, BuyerPool(tuple(cfg.train_buyers)), cfg.seed
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
        cut = f" (stopped by the time budget at {r.steps}/{cfg.sft_steps})" if r.steps < cfg.sft_steps else ""
        echo(f"warm start: {r.steps} SFT steps, loss {r.first_loss:.3f} -> {r.final_loss:.3f}, {r.seconds:.0f}s{cut}")
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return model, tok


def dev_eval(model: Any, tok: Any, cfg: TrainConfig) -> dict[str, dict[str, float]]:
    """Play on the dev split against the dev buyers (never the held-out suite), sampled at the rollout temperature
    with fixed seeds: the policy GRPO trains, measured the same way at every evaluation."""
    from .evaluate import evaluate, evaluate_chat

    scenarios = split_scenarios("dev", cfg.dev_scenarios, cfg.max_rounds)
    was = model.training
    model.eval()
    try:
        if cfg.is_tiny:
            from nego.agents.compact import CompactPolicy

            res = evaluate(CompactPolicy(model, tok), scenarios, DEV_BUYERS, temperature=cfg.temperature)
        else:
            res = evaluate_chat(model, tok, scenarios, DEV_BUYERS, temperature=cfg.temperature)
    finally:
        model.train(was)
    return {k: v.summary() for k, v in res.items()}


def dev_line(dev: dict[str, dict[str, float]]) -> str:
    """A dev evaluation on one line: utility / deal rate / invalid actions per episode, per buyer."""
    cells = (f"{b} {r['utility']:.3f} / {r['deal_rate']:.2f} / {r['invalid_per_episode']:.2f}" for b, r in dev.items())
    return "; ".join(cells) + " (utility / deal rate / invalid per episode)"


def grpo_args(cfg: TrainConfig, run_dir: Path, progress_bar: bool = True) -> Any:
    import torch
    from trl import GRPOConfig

    cpu = not torch.cuda.is_available()
    return GRPOConfig(
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
        temperature=cfg.temperature,
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


def _callbacks(cfg: TrainConfig, log: TrainLog, tok: Any, started: float, echo: Echo) -> tuple[list, dict]:
    from transformers import TrainerCallback

    state_box: dict[str, Any] = {"stopped_early": False, "t": time.perf_counter()}

    class Monitor(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            state_box["t"] = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                seconds = logs.get("step_time") or time.perf_counter() - state_box["t"]
                row = log.add(state.global_step, logs, float(seconds))
                if state.global_step % 10 == 0 or state.global_step == 1:
                    echo(
                        f"step {state.global_step}: reward {row['reward_mean']:.3f} deal {row['deal_rate']:.2f} "
                        f"invalid {row['invalid_rate']:.3f} entropy {row['entropy'] or 0:.3f} "
                        f"identical groups {row['identical_group_share'] or 0:.2f} ({row['step_seconds']:.1f}s)"
                    )

        def on_step_end(self, args, state, control, model=None, **kw):
            if cfg.eval_every and state.global_step % cfg.eval_every == 0 and model is not None:
                dev = dev_eval(model, tok, cfg)
                log.add_eval(state.global_step, dev)
                echo(f"step {state.global_step}: dev {dev_line(dev)}")
            minutes = (time.perf_counter() - started) / 60
            if cfg.time_budget_min and minutes >= cfg.time_budget_min and state.global_step < state.max_steps:
                state_box["stopped_early"] = True
                control.should_training_stop = True
                control.should_save = True
                echo(f"time budget of {cfg.time_budget_min} min reached at step {state.global_step}: stopping")

    return [Monitor()], state_box


def build_trainer(
    cfg: TrainConfig,
    model: Any,
    tok: Any,
    run_dir: Path,
    echo: Echo,
    started: float,
    *,
    reward_func: Callable[..., list[float]] | None = None,
    rollout_cls: type | None = None,
    scenarios: list | None = None,
    observer: TrainObserver | None = None,
) -> tuple:
    """The GRPOTrainer wired to the market rollout; returns (trainer, rollout, log, state_box).

    ``reward_func``, ``rollout_cls`` and ``scenarios`` replace the outcome reward, the rollout class and the training
    split (diagnostics such as bench/grpo_sanity.py use them to test the same wiring with a reward that is known to
    be learnable). With an ``observer`` (a live view) the trainer's own progress bar and log printing are off: the
    observer shows every step instead."""
    from datasets import Dataset
    from trl import GRPOTrainer

    if scenarios is None:
        scenarios = split_scenarios("train", cfg.train_scenarios, cfg.max_rounds)
    if rollout_cls is None:
        rollout_cls = MarketRollout
        if not cfg.is_tiny:
            from .chat_rollout import ChatMarketRollout as rollout_cls
    rollout = rollout_cls(
        scenarios,
        BuyerPool(tuple(cfg.train_buyers)),
        tok,
        seed=cfg.seed,
        max_tokens=cfg.max_tokens,
        group_size=cfg.group_size,
    )
    log = TrainLog(run_dir / "train_log.parquet", rollout.stats, echo, observer)
    callbacks, state_box = _callbacks(cfg, log, tok, started, echo)
    peft_config = None
    if cfg.finetune == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_func or make_reward_func(no_deal_value(cfg.no_deal_reward), cfg.invalid_penalty),
        args=grpo_args(cfg, run_dir, progress_bar=observer is None),
        train_dataset=Dataset.from_list([{"prompt": s.id} for s in scenarios]),
        processing_class=tok,
        rollout_func=rollout,
        callbacks=callbacks,
        peft_config=peft_config,
    )
    if observer is not None:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return trainer, rollout, log, state_box


def train(cfg: TrainConfig, echo: Echo = print, observer: TrainObserver | None = None) -> TrainResult:
    """Run (or resume) a whole training run and register ``NAME`` and ``NAME-rl``; ``observer`` sees every logged
    step and dev evaluation as it happens."""
    cfg = cfg.validate()
    _env()
    set_threads(cfg.threads)  # before torch loads, if it has not yet
    started = time.perf_counter()
    run_dir = run_dir_for(cfg)
    with exclusive_run(run_dir, f"nego train --name {cfg.run_name}"):
        return _train(cfg, run_dir, started, echo, observer)


def _train(cfg: TrainConfig, run_dir: Path, started: float, echo: Echo, observer: TrainObserver | None) -> TrainResult:
    if cfg.is_tiny:
        save_run_config(run_dir, cfg)
        model, tok = warm_start(cfg, run_dir, echo, started)
        base_path, sft_steps = str((run_dir / "base").resolve()), cfg.sft_steps
    else:
        from .hf_model import load_chat_model, model_source

        model, tok = load_chat_model(cfg)
        save_run_config(run_dir, cfg)
        base_path, sft_steps = model_source(cfg), 0
    base_dev = dev_eval(model, tok, cfg)
    base_name = cfg.run_name
    entry_cfg = _entry_config(cfg, "base")
    register(ModelEntry(base_name, base_path, "", _format(cfg), entry_cfg, sft_steps, {"dev": base_dev}))
    echo(f"registered {base_name}: dev {dev_line(base_dev)}")
    if observer is not None:
        observer.on_dev(0, base_dev)
    trainer, _, _, box = build_trainer(cfg, model, tok, run_dir, echo, started, observer=observer)
    resume_from = latest_checkpoint(run_dir) if cfg.resume else None
    if resume_from:
        echo(f"resuming from {resume_from}")
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    result = finish(cfg, trainer, tok, run_dir, base_name, box["stopped_early"], started, echo)
    if observer is not None:
        observer.on_dev(result.steps, result.dev)
    return result


def _format(cfg: TrainConfig) -> str:
    return "compact" if cfg.is_tiny else "hf"


def _entry_config(cfg: TrainConfig, stage: str) -> dict[str, Any]:
    """What the registry records about a run; chat models also record the prompt template they were trained on,
    which is how they are played unless the user names another."""
    out = {"stage": stage, "learning_rate": cfg.learning_rate, **{k: v for k, v in vars(cfg).items() if k != "resume"}}
    if not cfg.is_tiny:
        from nego.agents.prompts import DEFAULT_TEMPLATE

        out["template"] = DEFAULT_TEMPLATE
    return out


def finish(cfg, trainer, tok, run_dir: Path, base_name: str, stopped: bool, started: float, echo: Echo) -> TrainResult:
    final = run_dir / "final"
    trainer.save_model(str(final))
    tok.save_pretrained(final)
    if stopped:
        trainer.save_state()
    model = trainer.accelerator.unwrap_model(trainer.model)
    dev = dev_eval(model, tok, cfg)
    steps = int(trainer.state.global_step)
    rl_name = f"{base_name}-rl"
    register(
        ModelEntry(
            rl_name,
            str(final.resolve()),
            base_name,
            _format(cfg),
            _entry_config(cfg, "grpo"),
            steps,
            {"dev": dev, "stopped_early": stopped},
        )
    )
    echo(f"registered {rl_name} after {steps} GRPO steps: dev {dev_line(dev)}")
    return TrainResult(run_dir, base_name, rl_name, steps, stopped, dev, time.perf_counter() - started)
