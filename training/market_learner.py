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
    train_log.parquet          one row per update (the rows of ``nego train``'s log): step = policy version after it,
                               day, reward, loss, entropy, policy lag
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from nego.agents import NegotiatorFactory
from nego.agents.model_registry import ModelEntry, lookup, register
from nego.agents.trace import TokenTrace
from nego.market.learning import LearningGroup, LearnReport
from nego.market.marketplace import Job
from nego.market.types import EndReason, NegotiationResult

from .config import ConfigError, TrainConfig, no_deal_value
from .learners import learner_spec
from .policy_kind import PolicyKind, kind_of_format
from .rewards import outcome_scorer
from .rollout import filler_id, to_trl
from .runner import Sample
from .train_log import TrainLog
from .trainer import build_grpo_trainer, grpo_args, quiet_libraries, step_monitor

STATE = "state.json"


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

    def __init__(self, batches: list[list[Sample]], max_tokens: int, filler: int) -> None:
        self.batches = batches
        self.max_tokens = max_tokens
        self.filler = filler
        self.served: list[list[Sample]] = []

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        batch = self.batches[len(self.served)]
        if len(batch) != len(prompts):
            raise RuntimeError(f"an update needs {len(prompts)} episodes; {len(batch)} were queued for it")
        self.served.append(batch)
        return to_trl(batch, self.max_tokens, self.filler)


@dataclass(frozen=True, slots=True)
class LearnerState:
    """What a learner keeps between days (``state.json``): the day it learned through, its policy version, the
    checkpoint that holds that version, the groups waiting for an update and the groups it had to drop."""

    day: int = 0
    version: int = 0
    checkpoint: str | None = None
    dropped_groups: int = 0
    queue: tuple[tuple[Sample, ...], ...] = ()
    buyers: tuple[str, ...] = ()
    """Every buyer spec the policy has met (and learned from), sorted."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["queue"] = [[sample_to_json(e) for e in g] for g in self.queue]
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> LearnerState:
        queue = tuple(tuple(sample_from_json(e) for e in g) for g in d["queue"])
        buyers = tuple(d.get("buyers", ()))
        return LearnerState(d["day"], d["version"], d["checkpoint"], d.get("dropped_groups", 0), queue, buyers)


class GRPOLearner:
    """A registered model (``tiny``, ``NAME-rl``, a chat model) or ``hf:PATH`` that learns in the market under
    ``spec``. ``cfg`` supplies the GRPO settings (learning rate, group size, groups per update as
    ``scenarios_per_step``, temperature, reward, threads); the model's policy kind supplies how it loads, plays and
    is registered."""

    def __init__(self, base: str, cfg: TrainConfig, directory: Path, *, spec: str = "", echo: Any = print) -> None:
        self.base = base
        self.directory = Path(directory)
        self.spec = spec or learner_spec(base)
        self.group_size = cfg.group_size
        self.echo = echo
        self.entry = self._entry(base)
        self.kind: PolicyKind = kind_of_format(self.entry.format if self.entry else "hf")
        path = self.entry.path if self.entry else base.removeprefix("hf:")
        # the auto fields: the kind's own episode cap (a chat model's turns are capped one by one, so its episodes
        # are capped generously); full fine-tuning unless LoRA is asked for
        self.cfg = replace(
            cfg,
            model=self.kind.config_model(path),
            max_tokens=cfg.max_tokens or self.kind.learner_max_tokens,
            finetune="full" if cfg.finetune == "auto" else cfg.finetune,
        )
        self.model, self.tokenizer = self.kind.load(path)
        self._version = 0
        self._day = 0
        self._checkpoint: str | None = None
        self._queue: list[list[Sample]] = []
        self._scorer = outcome_scorer(no_deal_value(cfg.no_deal_reward), cfg.invalid_penalty)
        self.log = TrainLog(self.directory / "train_log.parquet", echo=echo)
        self.dropped_groups = 0
        self.buyers: set[str] = set()
        """Every buyer spec a learning negotiation of this policy has met."""

    # --- the Learner interface -------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    def factory(self) -> NegotiatorFactory:
        self.model.eval()
        return self.kind.factory(self.model, self.tokenizer, self.cfg, self.spec)

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
                self.buyers.update(p.job.buyer for p in g.episodes)
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
        state = LearnerState.from_json(json.loads(path.read_text()))
        self._day, self._version, self._checkpoint = state.day, state.version, state.checkpoint
        self._queue = [list(g) for g in state.queue]
        self.dropped_groups = state.dropped_groups
        self.buyers = set(state.buyers)
        self.log = TrainLog(self.log.path, echo=self.echo, resume_step=self._version)
        if self._checkpoint:
            self.model, _ = self.kind.load(str(self.directory / "checkpoints" / self._checkpoint))
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
        config = {
            "stage": "market-grpo",
            "base": self.base,
            "temperature": self.cfg.sampling_temperature,
            "train_buyers": sorted(self.buyers),  # what an evaluation's held-out check reads
        }
        config.update(self.kind.registry_config(self.cfg))  # the layout its policy played and learned in
        entry = ModelEntry(
            name,
            str(final.resolve()),
            self.entry.name if self.entry else self.base,
            self.kind.registry_format,
            config,
            self._version,
        )
        register(entry)
        return entry

    # --- internals -------------------------------------------------------------------------------------------

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
        """One ``trainer.train`` call for the day's updates, resumed from the previous day's checkpoint; it ends by
        writing the next one."""
        target = self._version + len(batches)
        overrides = dict(max_steps=target, save_steps=10**9, save_total_limit=2, ignore_data_skip=True)
        args = grpo_args(
            self.cfg,
            self.directory / "checkpoints",
            gradient_checkpointing=self.kind.gradient_checkpointing,
            overrides=overrides,
        )
        served = _Served(batches, self.cfg.max_tokens, filler_id(self.tokenizer))
        version = self._version

        def save_at_day_end(step: int, max_steps: int, model: Any, control: Any) -> None:
            if step >= target:
                control.should_save = True

        def context(step: int) -> dict[str, Any]:
            """The day, and the policy lag of the update's stalest episode."""
            lag = max(step - 1 - e.policy_version for e in batches[step - version - 1])
            return {"day": day, "max_policy_lag": lag}

        quiet_libraries()
        trainer = build_grpo_trainer(
            self.model,
            self.tokenizer,
            args,
            prompts=[f"group-{i}" for i in range(self.cfg.scenarios_per_step)],
            rollout_func=served,
            callbacks=[step_monitor(self.log, save_at_day_end, context=context)],
            pack=self.cfg.pack,
        )
        resume = str(self.directory / "checkpoints" / self._checkpoint) if self._checkpoint else None
        trainer.train(resume_from_checkpoint=resume)
        self.model = trainer.accelerator.unwrap_model(trainer.model)
        self._checkpoint = f"checkpoint-{target}"
        rewards = [e.reward for b in served.served for e in b]
        lags = [self._version + i - e.policy_version for i, b in enumerate(served.served) for e in b]
        self._version = target
        return {"reward": float(np.mean(rewards)), "mean_policy_lag": float(np.mean(lags))}

    def _save_state(self) -> None:
        queue = tuple(tuple(g) for g in self._queue)
        state = LearnerState(
            self._day, self._version, self._checkpoint, self.dropped_groups, queue, tuple(sorted(self.buyers))
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{STATE}.tmp"
        tmp.write_text(json.dumps(state.to_json()))
        os.replace(tmp, self.directory / STATE)  # the checkpoint it names was written first
