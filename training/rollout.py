"""Rollouts: the current policy plays real market negotiations; a thin adapter turns them into TRL's hook dict.

The market knows nothing about TRL: :func:`play` runs ordinary negotiations between compact negotiators and
rule-based (or model) buyers through :func:`nego.market.protocol.run_negotiation`; :func:`to_hook_dict` turns
the recorded traces and structured outcomes into ``prompt_ids / completion_ids / logprobs / env_mask`` plus
outcome columns that reach the reward function as keyword arguments.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from nego.agents.compact import CompactNegotiator, CompactPolicy, CompactTrace
from nego.agents.registry import NegotiatorFactory
from nego.market.protocol import run_negotiation
from nego.market.types import NegotiationResult
from nego.scenarios.generator import generate_scenarios
from nego.scenarios.scenario import Role, Scenario

from .pool import BuyerPool

# Generator seeds of the scenario splits: training, the dev split (defaults and early stopping are chosen
# on it) and the held-out split that only the final measurement reads.
SPLIT_SEEDS = {"train": 7101, "dev": 7202, "heldout": 7303}


def split_scenarios(
    split: str, n: int, max_rounds: int = 10, openers: Sequence[Role] = (Role.SELLER, Role.BUYER)
) -> list[Scenario]:
    """The first ``n`` generated scenarios of ``split`` (train, dev or heldout); scenario ``i`` is opened by
    ``openers[i % len(openers)]``, so by default half are opened by the buyer, as in the evaluation suites."""
    if not openers:
        raise ValueError("openers must name at least one role")
    scenarios = generate_scenarios(n, SPLIT_SEEDS[split], max_rounds=max_rounds)
    return [s.with_opener(openers[i % len(openers)]) for i, s in enumerate(scenarios)]


@dataclass(frozen=True, slots=True)
class Episode:
    """One finished negotiation as the seller saw and wrote it."""

    scenario: Scenario
    buyer_spec: str
    trace: CompactTrace
    result: NegotiationResult


async def play(
    policy: CompactPolicy,
    scenarios: Sequence[Scenario],
    buyers: Sequence[NegotiatorFactory],
    seeds: Sequence[int],
    temperature: float | None,
) -> list[Episode]:
    """Play ``scenarios[i]`` against ``buyers[i]`` concurrently; the policy batches its forward passes."""
    sellers = [CompactNegotiator(policy, Role.SELLER, s, temperature) for s in seeds]
    results = await asyncio.gather(
        *(
            run_negotiation(sc, seller, b(Role.BUYER, s), seed=s)
            for sc, seller, b, s in zip(scenarios, sellers, buyers, seeds, strict=True)
        )
    )
    episodes = []
    for sc, seller, b, res in zip(scenarios, sellers, buyers, results, strict=True):
        seller.trace.finish(res.outcome)
        episodes.append(Episode(sc, b.spec, seller.trace, res))
    return episodes


def to_hook_dict(episodes: Sequence[Episode], policy: CompactPolicy, max_tokens: int) -> dict[str, list]:
    """TRL's rollout dict: one sequence per negotiation, own tokens in the loss (env_mask 1), the rest context."""
    return hook_dict(
        [
            (
                [policy.ids[w] for w in ep.trace.prompt],
                [policy.ids[w] for w in ep.trace.words],
                ep.trace.mask,
                ep.trace.logprobs,
                ep.result,
                ep.scenario,
                ep.buyer_spec,
            )
            for ep in episodes
        ],
        max_tokens,
    )


def hook_dict(rows: Sequence[tuple], max_tokens: int) -> dict[str, list]:
    """Rows of (prompt ids, completion ids, mask, logprobs, result, scenario, buyer spec) -> the hook's dict;
    the outcome columns reach the reward function as keyword arguments."""
    out: dict[str, list] = {k: [] for k in HOOK_KEYS}
    for prompt, completion, mask, logprobs, result, scenario, buyer_spec in rows:
        if len(completion) > max_tokens:
            raise RuntimeError(
                f"episode on {scenario.id} has {len(completion)} tokens, over max_tokens={max_tokens}; "
                "raise max_tokens or lower max_rounds"
            )
        o = result.outcome
        out["prompt_ids"].append(list(prompt))
        out["completion_ids"].append(list(completion))
        out["logprobs"].append(list(logprobs))
        out["env_mask"].append(list(mask))
        out["seller_utility"].append(o.seller_utility)
        out["agreed"].append(o.agreed)
        out["reservation"].append(scenario.seller.reservation)
        out["invalid_seller"].append(o.invalid_seller)
        out["seller_turns"].append(sum(1 for t in result.turns if t.role is Role.SELLER))
        out["rounds"].append(o.rounds)
        out["buyer_spec"].append(buyer_spec)
    return out


HOOK_KEYS = (
    "prompt_ids",
    "completion_ids",
    "logprobs",
    "env_mask",
    "seller_utility",
    "agreed",
    "reservation",
    "invalid_seller",
    "seller_turns",
    "rounds",
    "buyer_spec",
)


@dataclass
class RolloutStats:
    """What the last rollouts looked like (read by the training log)."""

    episodes: int = 0
    deal_rate: float = 0.0
    invalid_rate: float = 0.0
    utility: float = 0.0
    seconds: float = 0.0
    tokens: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


class MarketRollout:
    """TRL ``rollout_func``: prompts are training scenario ids, already repeated ``group_size`` times.

    All negotiations of a group face the same drawn buyer (spec and parameters), so the group's reward spread,
    and with it the advantage, comes from the seller's own sampled choices rather than from the buyer draw."""

    def __init__(
        self,
        scenarios: Sequence[Scenario],
        pool: BuyerPool,
        tokenizer: Any,
        *,
        seed: int,
        max_tokens: int,
        group_size: int = 1,
    ) -> None:
        self.scenarios = {s.id: s for s in scenarios}
        self.group_size = group_size
        self.pool = pool
        self.tokenizer = tokenizer
        self.seed = seed
        self.max_tokens = max_tokens
        self.stats = RolloutStats()

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        t0 = time.perf_counter()
        step = int(trainer.state.global_step)
        scenarios = [self.scenarios[str(p)] for p in prompts]
        rngs = [np.random.default_rng([self.seed, step, i]) for i in range(len(prompts))]
        n_groups = -(-len(prompts) // self.group_size)
        drawn = [self.pool.factory(np.random.default_rng([self.seed, step, g, 1])) for g in range(n_groups)]
        buyers = [drawn[i // self.group_size] for i in range(len(prompts))]
        seeds = [int(r.integers(2**31)) for r in rngs]
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            hook = self.rollout(model, trainer, scenarios, buyers, seeds)
        finally:
            model.train(was_training)
        self._record(hook, time.perf_counter() - t0)
        return hook

    def rollout(self, model: Any, trainer: Any, scenarios: list, buyers: list, seeds: list[int]) -> dict[str, list]:
        """Play the batch with the compact protocol and return the hook dict."""
        policy = CompactPolicy(model, self.tokenizer)
        episodes = asyncio.run(play(policy, scenarios, buyers, seeds, float(trainer.temperature)))
        return to_hook_dict(episodes, policy, self.max_tokens)

    def _record(self, hook: dict[str, list], seconds: float) -> None:
        n = len(hook["prompt_ids"])
        turns = sum(hook["seller_turns"])
        s = self.stats
        s.episodes = n
        s.deal_rate = sum(hook["agreed"]) / n
        s.invalid_rate = sum(hook["invalid_seller"]) / max(1, turns)
        s.utility = float(np.mean(hook["seller_utility"]))
        s.seconds = seconds
        s.tokens = sum(len(p) + len(c) for p, c in zip(hook["prompt_ids"], hook["completion_ids"], strict=True))
