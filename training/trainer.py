"""The one GRPO trainer assembly: TRL's ``GRPOTrainer`` (with the seeded per-epoch prompt order and the loss read in
length buckets, :mod:`.market_grpo`) wired to a rollout function, the reward the runner scored, nego's step log and
the caller's step-end rule. ``nego train`` (:mod:`.grpo`) and the in-market learner (:mod:`.market_learner`) both
build theirs here, so they share the TRL settings, the callback, the training-log rows and the checkpoint layout."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .free_memory import release_freed_memory
from .rollout import trl_reward

if TYPE_CHECKING:
    from .config import TrainConfig
    from .train_log import StepRow, TrainLog

StepEnd = Callable[[int, int, Any, Any], None]
"""Called after every optimizer step with (step, max steps, the model, TRL's control object)."""
StepLogged = Callable[["StepRow"], None]


def quiet_libraries() -> None:
    """nego prints its own lines: TRL's and transformers' progress bars and deprecation notices are off."""
    import warnings

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for module in ("transformers", "trl", "accelerate", "peft"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def grpo_args(
    cfg: TrainConfig, output_dir: Path, *, gradient_checkpointing: bool, overrides: dict[str, Any] | None = None
) -> Any:
    """TRL's GRPOConfig for ``cfg``; ``overrides`` (a memory plan's micro-batch layout, a learner's schedule) win."""
    import torch
    from trl import GRPOConfig

    cpu = not torch.cuda.is_available()
    fields: dict[str, Any] = dict(
        output_dir=str(output_dir),
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
        gradient_checkpointing=gradient_checkpointing,
        logging_steps=1,
        save_strategy="steps",
        save_steps=cfg.save_every or cfg.steps,
        report_to="none",
        disable_tqdm=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
        use_vllm=cfg.use_vllm,
        vllm_mode="server" if cfg.vllm_server else "colocate",
        **({"vllm_server_base_url": cfg.vllm_server} if cfg.vllm_server else {}),
    )
    return GRPOConfig(**{**fields, **(overrides or {})})


def step_monitor(
    log: TrainLog,
    step_end: StepEnd,
    on_row: StepLogged | None = None,
    context: Callable[[int], dict[str, Any]] | None = None,
) -> Any:
    """The trainer callback: each logged step becomes a row of ``log`` (timed from the step's start; ``context``
    gives a step's extra fields, such as the learner's day), handed to ``on_row``; ``step_end`` decides
    evaluations, saves and stops."""
    from transformers import TrainerCallback

    class StepMonitor(TrainerCallback):
        started = time.perf_counter()

        def on_step_begin(self, args, state, control, **kw):
            self.started = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                seconds = logs.get("step_time") or time.perf_counter() - self.started
                step = state.global_step
                row = log.add(step, logs, float(seconds), **(context(step) if context else {}))
                if on_row is not None:
                    on_row(row)

        def on_step_end(self, args, state, control, model=None, **kw):
            step_end(state.global_step, state.max_steps, model, control)
            release_freed_memory()  # the step's activations, so that the next rollout starts from the states alone

    return StepMonitor()


def build_grpo_trainer(
    model: Any,
    tokenizer: Any,
    args: Any,
    *,
    prompts: Sequence[str],
    rollout_func: Callable[[list, Any], dict[str, list]],
    callbacks: Sequence[Any],
    reward_func: Callable[..., list[float]] = trl_reward,
    peft_config: Any = None,
    pack: bool = True,
) -> Any:
    """A GRPOTrainer over a dataset of ``prompts`` (scenario ids, or the learner's group slots) whose rollouts
    ``rollout_func`` plays; TRL's own metric printing is off (the step log prints nego's lines). ``pack`` reads the
    loss's log-probabilities in length buckets (:mod:`.packing`) instead of TRL's one padded matrix."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from .market_grpo import grpo_trainer_class

    trainer = grpo_trainer_class()(
        model=model,
        reward_funcs=reward_func,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tokenizer,
        rollout_func=rollout_func,
        callbacks=list(callbacks),
        peft_config=peft_config,
        pack=pack,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def lora_config(rank: int) -> Any:
    """LoRA adapters on every linear layer (``finetune = lora``)."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
