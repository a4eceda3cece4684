"""Evaluation of a compact seller against named buyers on fixed scenarios (paired across models)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from nego.agents.compact import CompactPolicy
from nego.agents.registry import resolve
from nego.scenarios.scenario import Scenario

from .rollout import play


@dataclass(frozen=True, slots=True)
class BuyerResult:
    """Per-negotiation results against one buyer, in scenario order (so two models can be paired)."""

    buyer: str
    utility: tuple[float, ...]
    agreed: tuple[bool, ...]
    invalid: tuple[int, ...]

    @property
    def mean_utility(self) -> float:
        return float(np.mean(self.utility))

    @property
    def deal_rate(self) -> float:
        return float(np.mean(self.agreed))

    def summary(self) -> dict[str, float]:
        return {
            "utility": round(self.mean_utility, 4),
            "deal_rate": round(self.deal_rate, 4),
            "invalid_per_episode": round(float(np.mean(self.invalid)), 4),
            "n": len(self.utility),
        }


def evaluate(
    policy: CompactPolicy,
    scenarios: Sequence[Scenario],
    buyers: Sequence[str],
    seed: int = 0,
    temperature: float | None = None,
) -> dict[str, BuyerResult]:
    """Play every scenario once against each buyer spec, greedily (or sampling at ``temperature``, the way GRPO
    trains the policy); seeds depend only on (seed, index)."""
    out = {}
    seeds = [int(x) for x in np.random.default_rng([seed, 99]).integers(2**31, size=len(scenarios))]
    for spec in buyers:
        factory = resolve(spec)
        episodes = asyncio.run(play(policy, scenarios, [factory] * len(scenarios), seeds, temperature))
        out[spec] = BuyerResult(
            spec,
            tuple(e.result.outcome.seller_utility for e in episodes),
            tuple(e.result.outcome.agreed for e in episodes),
            tuple(e.result.outcome.invalid_seller for e in episodes),
        )
    return out


def evaluate_chat(
    model,
    tokenizer,
    scenarios: Sequence[Scenario],
    buyers: Sequence[str],
    seed: int = 0,
    temperature: float | None = None,
):
    """:func:`evaluate` for chat models (JSON actions through the chat template)."""
    from .chat_rollout import ChatPolicy, play_chat

    out = {}
    seeds = [int(x) for x in np.random.default_rng([seed, 99]).integers(2**31, size=len(scenarios))]
    policy = ChatPolicy(model, tokenizer)
    for spec in buyers:
        factory = resolve(spec)
        played = asyncio.run(play_chat(policy, scenarios, [factory] * len(scenarios), seeds, temperature))
        outcomes = [res.outcome for _, res in played]
        out[spec] = BuyerResult(
            spec,
            tuple(o.seller_utility for o in outcomes),
            tuple(o.agreed for o in outcomes),
            tuple(o.invalid_seller for o in outcomes),
        )
    return out
