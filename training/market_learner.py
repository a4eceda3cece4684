"""A seller that learns with GRPO while the market runs: the :class:`~nego.market.learning.Learner` behind
``nego simulate --learn``.

Each day the market hands over the learning pairs' groups (one scenario, one buyer, ``group_size`` seeds each). The
learner queues them and runs one GRPO update (TRL's ``GRPOTrainer``, the same rollout adapter, reward and loss as
``nego train``) per ``groups_per_update`` queued groups; groups that do not fill an update wait for the next day (the
policy lag of every update is logged). A day's updates run as one ``trainer.train`` call resumed from the previous
day's checkpoint, which it ends by writing the next one: optimizer, scheduler and RNG state travel through the same
checkpoints as ``nego train``, and a killed simulation resumes from the last one.

Layout of the learner's directory::

    state.json                 day learned through, policy version, checkpoint, queued groups (token ids, rewards)
    checkpoints/checkpoint-N/  the policy after N updates (N = policy version), with optimizer and RNG state
    train_log.parquet          one row per update: day, reward, loss, entropy, policy lag
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from nego.agents import NegotiatorFactory
from nego.agents.model_registry import ModelEntry, lookup, register
from nego.agents.trace import TokenTrace
from nego.market.learning import LearningGroup, LearnReport
from nego.market.marketplace import Job
from nego.market.types import EndReason, NegotiationResult

from .config import TINY_MAX_TOKENS, ConfigError, TrainConfig, no_deal_value
from .rewards import outcome_scorer
from .rollout import to_trl, trl_reward
from .runner import Sample

STATE = "state.json"
CHAT_LEARNER_MAX_TOKENS = 4096


def sample_to_json(e: Sample) -> dict[str, Any]:
    t = e.trace
    return {
        "id": e.negotiation_id,
        "scenario": e.scenario_id,
        "prompt": list(t.prompt_ids),
        "completion": list(t.completion_ids),
        "mask": list(t.mask),
        "logprobs": list(t.logprobs),
        "reward": e.reward,
        "version": e.policy_version,
    }


def sample_from_json(d: dict[str, Any]) -> Sample:
    trace = TokenTrace(tuple(d["prompt"]), tuple(d["completion"]), tuple(d["mask"]), tuple(d["logprobs"]))
    return Sample(d["id"], d["scenario"], trace, float(d["reward"]), int(d["version"]))


class _Served:
    """The ``rollout_func`` of a day's updates: hands TRL the queued groups, one update's worth per call."""

    def __init__(self, batches: list[list[Sample]], max_tokens: int) -> None:
        self.batches = batches
        self.max_tokens = max_tokens
        self.served: list[list[Sample]] = []

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        batch = self.batches[len(self.served)]
        if len(batch) != len(prompts):
            raise RuntimeError(f"an update needs {len(prompts)} episodes; {len(batch)} were queued for it")
        self.served.append(batch)
        return to_trl(batch, self.max_tokens)


class GRPOLearner:
    """A registered model (``tiny``, ``NAME-rl``, a chat model) or ``hf:PATH`` that learns in the market under
    ``spec``. ``cfg`` supplies the GRPO settings (learning rate, group size, groups per update as
    ``scenarios_per_step``, temperature, reward, threads)."""

    def __init__(self, base: str, cfg: TrainConfig, directory: Path, *, spec: str = "", echo: Any = print) -> None:
        self.base = base
        self.cfg = cfg
        self.directory = Path(directory)
        self.spec = spec or f"{base.removeprefix('hf:').rstrip('/').rsplit('/', 1)[-1]}-learning"
        self.group_size = cfg.group_size
        self.echo = echo
        self.entry = self._entry(base)
        # the auto fields: a compact model's own cap; a chat model's episodes are capped generously (its turns are
        # capped one by one) and it trains fully unless LoRA is asked for
        cap = cfg.max_tokens or (TINY_MAX_TOKENS if self._compact else CHAT_LEARNER_MAX_TOKENS)
        self.cfg = replace(cfg, max_tokens=cap, finetune="full" if cfg.finetune == "auto" else cfg.finetune)
        self.model, self.tokenizer = self._load(self.entry.path if self.entry else base.removeprefix("hf:"))
        self._version = 0
        self._day = 0
        self._checkpoint: str | None = None
        self._queue: list[list[Sample]] = []
        self._scorer = outcome_scorer(no_deal_value(cfg.no_deal_reward), cfg.invalid_penalty)
        self.log_rows: list[dict[str, Any]] = []
        self.dropped_groups = 0

    # --- the Learner interface -------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    def factory(self) -> NegotiatorFactory:
        from .grpo import learner_factory

        self.model.eval()
        return learner_factory(self.model, self.tokenizer, self._play_config(), self.spec)

    def score(self, job: Job, result: NegotiationResult) -> float | None:
        return self._scorer(job, result)

    def learn(self, day: int, groups: Sequence[LearningGroup]) -> LearnReport:
        t0 = time.perf_counter()
        for g in groups:
            episodes = self._queueable(g)
            if episodes is None:
                self.dropped_groups += 1
                self.echo(f"day {day}: dropped learning group of pair {g.pair} (a negotiation ended in an error)")
            else:
                self._queue.append(episodes)
        per_update = self.cfg.scenarios_per_step
        n = len(self._queue) // per_update
        batches = [[e for g in self._queue[i * per_update : (i + 1) * per_update] for e in g] for i in range(n)]
        self._queue = self._queue[n * per_update :]
        metrics: dict[str, float] = {}
        if batches:
            metrics = self._update(day, batches)
        self._day = day
        self._save_state()
        metrics["seconds"] = time.perf_counter() - t0
        return LearnReport(self._version, len(batches), len(self._queue), metrics)

    def resume(self) -> int:
        path = self.directory / STATE
        if not path.exists():
            return 0
        state = json.loads(path.read_text())
        self._day, self._version, self._checkpoint = state["day"], state["version"], state["checkpoint"]
        self._queue = [[sample_from_json(e) for e in g] for g in state["queue"]]
        self.dropped_groups = state.get("dropped_groups", 0)
        if self._checkpoint:
            self.model, _ = self._load(str(self.directory / "checkpoints" / self._checkpoint))
        self.echo(f"{self.spec}: resumed at policy version {self._version} (learned through day {self._day})")
        return self._day

    def close(self) -> None:
        pass

    # --- after the run ---------------------------------------------------------------------------------------

    def register(self, name: str) -> ModelEntry:
        """Save the current policy under ``directory/final`` and register it as ``name``."""
        final = self.directory / "final"
        self.model.save_pretrained(final)
        self.tokenizer.save_pretrained(final)
        fmt = "compact" if self._compact else "hf"
        config = {"stage": "market-grpo", "base": self.base, "temperature": self._play_config().sampling_temperature}
        if not self._compact:
            from .chat_rollout import layout_config

            config.update(layout_config(self.cfg.turn_tokens))  # the layout its policy played and learned in
        entry = ModelEntry(
            name, str(final.resolve()), self.entry.name if self.entry else self.base, fmt, config, self._version
        )
        register(entry)
        return entry

    # --- internals -------------------------------------------------------------------------------------------

    @property
    def _compact(self) -> bool:
        return self.entry is not None and self.entry.format == "compact"

    def _entry(self, base: str) -> ModelEntry | None:
        if base.startswith("hf:"):
            if not Path(base[3:]).exists():
                raise ConfigError(f"--learn {base}: {base[3:]} does not exist")
            return None
        entry = lookup(base)
        if entry is None:
            raise ConfigError(
                f"--learn {base}: no model registered under that name; train one first (`nego train` registers "
                "`tiny`) or give hf:PATH"
            )
        return entry

    def _load(self, path: str) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

        model = AutoModelForCausalLM.from_pretrained(path)
        if self._compact:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path)
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
        return model, tokenizer

    def _play_config(self) -> TrainConfig:
        return replace(self.cfg, model="tiny" if self._compact else f"hf:{self.base}")

    def _queueable(self, group: LearningGroup) -> list[Sample] | None:
        out = []
        for p in group.episodes:
            if p.result.outcome.end_reason is EndReason.ERROR or not isinstance(p.seller_record, TokenTrace):
                return None
            version = p.job.policy_version if p.job.policy_version is not None else self._version
            reward = 0.0 if p.reward is None else float(p.reward)
            out.append(Sample(p.job.negotiation_id, p.job.scenario.id, p.seller_record, reward, version))
        return out

    def _update(self, day: int, batches: list[list[Sample]]) -> dict[str, float]:
        from datasets import Dataset
        from trl import GRPOTrainer

        from .grpo import grpo_args

        target = self._version + len(batches)
        args = grpo_args(self._play_config(), self.directory, progress_bar=False)
        args.max_steps = target
        args.save_strategy = "steps"
        args.save_steps = 10**9
        args.save_total_limit = 2
        args.ignore_data_skip = True
        args.output_dir = str(self.directory / "checkpoints")
        served = _Served(batches, self.cfg.max_tokens)
        per_update = self.cfg.scenarios_per_step
        logs: list[dict[str, float]] = []
        trainer = GRPOTrainer(
            model=self.model,
            reward_funcs=trl_reward,
            args=args,
            train_dataset=Dataset.from_list([{"prompt": f"group-{i}"} for i in range(per_update)]),
            processing_class=self.tokenizer,
            rollout_func=served,
            callbacks=[day_end_callback(target, logs)],
        )
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # the market reports each day; per-update numbers go to the log
        resume = str(self.directory / "checkpoints" / self._checkpoint) if self._checkpoint else None
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        trainer.train(resume_from_checkpoint=resume)
        self.model = trainer.accelerator.unwrap_model(trainer.model)
        self._checkpoint = f"checkpoint-{target}"
        rewards = [e.reward for b in served.served for e in b]
        lags = [self._version + i - e.policy_version for i, b in enumerate(served.served) for e in b]
        for i, (batch, row) in enumerate(zip(served.served, logs, strict=False)):
            self.log_rows.append(
                {
                    "day": day,
                    "update": self._version + i + 1,
                    "reward": float(np.mean([e.reward for e in batch])),
                    "loss": row.get("loss"),
                    "entropy": row.get("entropy"),
                    "identical_group_share": row.get("frac_reward_zero_std"),
                    "max_policy_lag": max(self._version + i - e.policy_version for e in batch),
                }
            )
        self._version = target
        self._write_log()
        return {"reward": float(np.mean(rewards)), "mean_policy_lag": float(np.mean(lags))}

    def _save_state(self) -> None:
        state = {
            "day": self._day,
            "version": self._version,
            "checkpoint": self._checkpoint,
            "dropped_groups": self.dropped_groups,
            "queue": [[sample_to_json(e) for e in g] for g in self._queue],
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{STATE}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.directory / STATE)  # the checkpoint it names was written first

    def _write_log(self) -> None:
        import polars as pl

        tmp = self.directory / ".train_log.tmp"
        pl.DataFrame(self.log_rows, infer_schema_length=None).write_parquet(tmp)
        os.replace(tmp, self.directory / "train_log.parquet")


def _float_logs(logs: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in logs.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def day_end_callback(target: int, logs: list[dict[str, float]]) -> Any:
    """A trainer callback that writes a checkpoint after the day's last update (``target``) and collects each
    update's logged numbers into ``logs``."""
    from transformers import TrainerCallback

    class DayEnd(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= target:
                control.should_save = True

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                collected.append(_float_logs(logs))

    collected = logs
    return DayEnd()
