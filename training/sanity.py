"""A learnability check of the GRPO wiring: the real market rollout and trainer, with a reward that is easy to learn.

Used by ``bench/grpo_sanity.py`` and the slow learning test. The rollout is the ordinary
:class:`~nego.training.rollout.MarketRollout` through the episode runner, scored by the sanity reward instead of
the outcome; the trainer comes from :func:`nego.training.grpo.build_trainer`, so everything but the reward is the
wiring of ``nego train``. Along the way it records the plumbing checks: reward rows that belong to another prompt
than the one TRL scored them for, and the gap between the log-probabilities the rollout recorded for the seller's
own tokens and the ones the trained model computes for the same ids.
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from nego.market.marketplace import Job, Scorer
from nego.market.types import ActionKind, NegotiationResult
from nego.scenarios.scenario import Role

from .config import TrainConfig, no_deal_value
from .rewards import outcome_scorer
from .rollout import MarketRollout

REWARDS = ("first-offer", "outcome")
OPENERS = (Role.SELLER,)
"""The check's scenarios are opened by the seller: the first-offer reward scores the opening offer."""
NO_OFFER_REWARD = -1.0
"""First-offer reward of an episode whose first seller move is not a valid offer. With 0 here (the reward of an
opening at utility 1) a group of high openings had nothing to prefer over invalid ones, and at a high learning
rate the policy could drift into invalid openings, where every group is identical and learning stops."""


@dataclass
class SanityChecks:
    """Per-step plumbing measurements."""

    logprob_gap: list[float] = field(default_factory=list)
    misaligned: list[int] = field(default_factory=list)
    group_std: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SanityRun:
    logs: list[dict[str, Any]]
    checks: SanityChecks
    seconds: float

    @property
    def rewards(self) -> list[float]:
        return [float(row["reward"]) for row in self.logs]


def first_offer_utility(job: Job, result: NegotiationResult) -> float | None:
    """Own utility of the seller's first move if it is a valid offer, else None."""
    first = next((t for t in result.turns if t.role is Role.SELLER), None)
    if first is None or not first.valid or first.action.kind is not ActionKind.OFFER or first.action.offer is None:
        return None
    return job.scenario.view_for(Role.SELLER).utility(first.action.offer)


def sanity_scorer(kind: str, cfg: TrainConfig) -> Scorer:
    """``first-offer``: 1 - own utility of the first offer, and ``NO_OFFER_REWARD`` when the first move is not a
    valid offer (below every valid opening, so that giving up on offering is never a way up the reward);
    ``outcome``: the training reward."""
    if kind not in REWARDS:
        raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {kind!r}")
    if kind == "outcome":
        return outcome_scorer(no_deal_value(cfg.no_deal_reward), cfg.invalid_penalty)

    def score(job: Job, result: NegotiationResult) -> float:
        u = first_offer_utility(job, result)
        return NO_OFFER_REWARD if u is None else 1.0 - u

    return score


def checked_reward(checks: SanityChecks, group: int) -> Callable[..., list[float]]:
    """TRL's reward function, counting rows whose episode was played on another scenario than TRL's prompt."""

    def reward(prompts: Sequence[Any], completions: Sequence[Any], *, reward, scenario_id, **_: Any) -> list[float]:
        checks.misaligned.append(sum(str(p) != s for p, s in zip(prompts, scenario_id, strict=True)))
        r = [float(x) for x in reward]
        checks.group_std.append(float(np.array(r).reshape(-1, group).std(1).mean()))
        return r

    return reward


def logprob_gap(model: Any, hook: dict[str, list], temperature: float, n: int = 4) -> float:
    """Largest |recorded - recomputed| log-probability over the seller's own tokens of the first ``n`` episodes."""
    import torch

    gap = 0.0
    with torch.no_grad():
        for i in range(min(n, len(hook["prompt_ids"]))):
            p, c = hook["prompt_ids"][i], hook["completion_ids"][i]
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float() / temperature
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None])[:, 0]
            own = torch.tensor(hook["env_mask"][i], dtype=torch.bool)
            gap = max(gap, float((lp[own] - torch.tensor(hook["logprobs"][i])[own]).abs().max()))
    return gap


def sanity_rollout_cls(checks: SanityChecks) -> type[MarketRollout]:
    """A MarketRollout that records the log-prob gap of every batch."""

    class SanityRollout(MarketRollout):
        def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
            hook = super().__call__(prompts, trainer)
            model = trainer.accelerator.unwrap_model(trainer.model)
            checks.logprob_gap.append(logprob_gap(model, hook, float(trainer.temperature)))
            return hook

    return SanityRollout


def warm_start(cfg: TrainConfig) -> tuple[Any, Any, float]:
    """A tiny model behaviour-cloned on ``cfg.sft_episodes`` rule-seller transcripts against ``cfg.train_buyers``;
    returns (model, tokenizer, final SFT loss)."""
    from .pool import BuyerPool
    from .rollout import split_scenarios
    from .sft import behaviour_clone, record_transcripts
    from .tiny_model import build_tiny_model
    from .tokenizer import build_tokenizer

    cfg = cfg.kind.resolve(cfg)
    aims = cfg.offer_words == "aim"
    tok = build_tokenizer(aims)
    model = build_tiny_model(tok, seed=cfg.seed)
    scenarios = split_scenarios("train", cfg.train_scenarios, cfg.max_rounds, OPENERS)
    pool = BuyerPool(tuple(cfg.train_buyers)).rules()
    traces = record_transcripts(
        scenarios, cfg.sft_episodes, cfg.sft_sellers, pool, cfg.seed, pick=cfg.sft_pick, aims=aims
    )
    r = behaviour_clone(model, tok, traces, steps=cfg.sft_steps, lr=cfg.sft_lr, batch=cfg.sft_batch, seed=cfg.seed)
    return model, tok, r.final_loss


def run_sanity(cfg: TrainConfig, model: Any, tok: Any, kind: str) -> SanityRun:
    """GRPO on a copy of ``model`` through ``grpo.build_trainer`` with the sanity reward; returns the logs."""
    from . import grpo
    from .rollout import split_scenarios

    checks = SanityChecks()
    with tempfile.TemporaryDirectory() as tmp, grpo.open_runner(cfg, Path(tmp), sanity_scorer(kind, cfg)) as runner:
        parts = grpo.build_trainer(
            cfg,
            copy.deepcopy(model),
            tok,
            Path(tmp),
            lambda s: None,
            time.perf_counter(),
            runner,
            rollout_cls=sanity_rollout_cls(checks),
            scenarios=split_scenarios("train", cfg.train_scenarios, cfg.max_rounds, OPENERS),
            reward_func=checked_reward(checks, cfg.group_size),
        )
        t0 = time.perf_counter()
        parts.trainer.train()
        seconds = time.perf_counter() - t0
    return SanityRun([row for row in parts.trainer.state.log_history if "reward" in row], checks, seconds)
