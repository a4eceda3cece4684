"""GRPO rollouts: the current policy plays a batch of training jobs through the episode runner; a thin adapter at
TRL's edge turns the typed :class:`~nego.training.runner.Rollout` s into the ``rollout_func`` dict.

A batch is ``scenarios_per_step`` groups of ``group_size`` negotiations. A group shares its scenario (TRL's prompt)
and its buyer (spec and drawn parameters), so the reward spread inside it, and with it the advantage, comes from the
seller's own sampled choices. Every negotiation is a market :class:`~nego.market.marketplace.Job` whose id names
its step, group and index, seeded like any other job, written to the run's transcripts with the reward the trainer
saw.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from nego.agents.registry import NegotiatorFactory
from nego.market.marketplace import Job
from nego.market.rates import deal_rate_of, invalid_per_move_of
from nego.scenarios.generator import generate_scenarios
from nego.scenarios.scenario import Role, Scenario

from .league import League, league_every
from .policy_kind import RolloutPolicy
from .pool import BuyerPool
from .runner import EpisodeRunner, Rollout, Sample

# Generator seeds of the scenario splits: training, the dev split (defaults and early stopping are chosen
# on it) and the held-out split that only the final measurement reads.
SPLIT_SEEDS = {"train": 7101, "dev": 7202, "heldout": 7303}
TRAIN_ARM = "train"


def split_scenarios(
    split: str, n: int, max_rounds: int = 10, openers: Sequence[Role] = (Role.SELLER, Role.BUYER)
) -> list[Scenario]:
    """The first ``n`` generated scenarios of ``split`` (train, dev or heldout); scenario ``i`` is opened by
    ``openers[i % len(openers)]``, so by default half are opened by the buyer, as in the evaluation suites."""
    if not openers:
        raise ValueError("openers must name at least one role")
    return list(_split_scenarios(split, n, max_rounds, tuple(Role(o) for o in openers)))


@lru_cache(maxsize=8)
def _split_scenarios(split: str, n: int, max_rounds: int, openers: tuple[Role, ...]) -> tuple[Scenario, ...]:
    """Generated once per arguments in a process (a training run asks for its split more than once; scenarios are
    immutable, so the copies can be shared)."""
    scenarios = generate_scenarios(n, SPLIT_SEEDS[split], max_rounds=max_rounds)
    return tuple(s.with_opener(openers[i % len(openers)]) for i, s in enumerate(scenarios))


def step_jobs(
    scenarios: Sequence[Scenario],
    pool: BuyerPool,
    *,
    seller: str,
    seed: int,
    step: int,
    group_size: int,
    run_id: str = "",
) -> list[Job]:
    """The jobs of GRPO step ``step``: row ``i`` plays ``scenarios[i]`` (TRL repeats each prompt ``group_size``
    times) in group ``i // group_size``; one buyer is drawn per group. The id names step, group and index, so a
    resumed run plays the very same jobs and its transcripts never hold a negotiation twice. ``policy_version`` is
    the number of updates the policy has had: ``step``."""
    n_groups = -(-len(scenarios) // group_size)
    buyers = [pool.draw(np.random.default_rng([seed, step, g, 1])) for g in range(n_groups)]
    jobs = []
    for i, scenario in enumerate(scenarios):
        g = i // group_size
        job_seed = int(np.random.default_rng([seed, step, i]).integers(2**31))
        nid = f"{TRAIN_ARM}-s{step:06d}-g{g:03d}-{i % group_size:02d}"
        jobs.append(
            Job(scenario, seller, buyers[g], job_seed, nid, run_id, TRAIN_ARM, step=step, group=g, policy_version=step)
        )
    return jobs


def to_trl(samples: Sequence[Sample], max_tokens: int, filler: int = 0) -> dict[str, list]:
    """TRL's rollout dict: one sequence per negotiation (own tokens in the loss, ``env_mask`` 1; the rest context),
    the reward the trainer scores, and the scenario id for alignment checks. Only here do records become dicts.

    An episode longer than ``max_tokens`` after its prompt keeps its row (its group still needs its reward) but is cut
    to the cap with every token out of the loss, so nothing is learned from a tail the trainer never saw; the
    ``over_cap`` column counts them for the training log. An episode whose trace is empty (the seller never spoke:
    the buyer walked away or the clock ran out first) keeps its row the same way, as one ``filler`` id of prompt and
    one of completion, out of the loss: TRL reads every row's last completion id, and an empty row has none. The
    filler should be the tokenizer's pad id (0 is the compact vocabulary's), which TRL counts as a finished reply."""
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "reward")}
    out["scenario_id"], out["over_cap"] = [], []
    for r in samples:
        t = r.trace
        ids, mask, logprobs = list(t.completion_ids), list(t.mask), list(t.logprobs)
        over = len(ids) > max_tokens
        if over:
            ids, logprobs, mask = ids[:max_tokens], logprobs[:max_tokens], [0] * max_tokens
        if not ids:
            ids, logprobs, mask = [filler], [0.0], [0]
        out["prompt_ids"].append(list(t.prompt_ids) or [filler])
        out["completion_ids"].append(ids)
        out["logprobs"].append(logprobs)
        out["env_mask"].append(mask)
        out["reward"].append(r.reward)
        out["scenario_id"].append(r.scenario_id)
        out["over_cap"].append(over)
    return out


def trl_reward(prompts: Sequence[Any], completions: Sequence[Any], *, reward: Sequence[float], **_: Any) -> list[float]:
    """TRL's reward function: the reward the runner's scorer already gave each negotiation (and wrote to the
    transcripts), so what the trainer sees and what the transcripts say are one number."""
    return [float(r) for r in reward]


@dataclass
class RolloutStats:
    """What the last rollouts looked like (read by the training log)."""

    episodes: int = 0
    deal_rate: float = 0.0
    """Deals per negotiation in the last batch (0 without negotiations)."""
    invalid_rate: float = 0.0
    """Invalid seller moves per seller move, pooled over the last batch (0 without moves): the training log's
    ``invalid_rate``."""
    utility: float = 0.0
    seconds: float = 0.0
    tokens: int = 0
    generated: int = 0
    """Tokens the policy wrote in the last batch (the trained ones)."""
    over_cap: int = 0
    """Episodes longer than the cap in the last batch (kept for their group's reward, out of the loss)."""
    history: list[dict[str, float]] = field(default_factory=list)

    def record(self, rollouts: Sequence[Rollout], seconds: float) -> None:
        self.episodes = len(rollouts)
        self.deal_rate = deal_rate_of(r.result.outcome for r in rollouts) or 0.0
        self.invalid_rate = invalid_per_move_of(r.result for r in rollouts) or 0.0
        self.utility = float(np.mean([r.result.outcome.seller_utility for r in rollouts])) if rollouts else 0.0
        self.seconds = seconds
        self.tokens = sum(len(r.trace) for r in rollouts)
        self.generated = sum(r.trace.own_tokens for r in rollouts)


def filler_id(tokenizer: Any) -> int:
    """The id :func:`to_trl` gives an empty episode: the tokenizer's pad id, else its EOS, else 0."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(token_id, int):
            return token_id
    return 0


class MarketRollout:
    """TRL ``rollout_func``: ``prompts`` are training scenario ids, already repeated ``group_size`` times; the current
    policy plays them as the learner ``spec`` through ``runner``, as its kind's rollout ``policy`` makes negotiators
    of it."""

    def __init__(
        self,
        scenarios: Sequence[Scenario],
        pool: BuyerPool,
        tokenizer: Any,
        runner: EpisodeRunner,
        *,
        policy: RolloutPolicy,
        spec: str,
        seed: int,
        max_tokens: int,
        group_size: int,
        run_id: str = "",
        league_dir: Path | None = None,
    ) -> None:
        self.scenarios = {s.id: s for s in scenarios}
        self.pool = pool
        self.policy = policy
        self.tokenizer = tokenizer
        self.runner = runner
        self.spec = spec
        self.seed = seed
        self.max_tokens = max_tokens
        self.group_size = group_size
        self.run_id = run_id
        self.stats = RolloutStats()
        self.last: list[Rollout] = []
        if pool.league and league_dir is None:
            raise ValueError("a pool with league buyers needs league_dir, where their snapshots are kept")
        self.leagues = {n: League(n, Path(league_dir or ".") / f"every-{n}", tokenizer) for n in pool.league}

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        t0 = time.perf_counter()
        step = int(trainer.state.global_step)
        jobs = step_jobs(
            [self.scenarios[str(p)] for p in prompts],
            self.pool,
            seller=self.spec,
            seed=self.seed,
            step=step,
            group_size=self.group_size,
            run_id=self.run_id,
        )
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            self.runner.set_learner(self.spec, self.learner(model, trainer))
            jobs = self.league_buyers(jobs, model, step, float(trainer.temperature))
            self.last = self.runner.rollouts(jobs)
        finally:
            model.train(was_training)
            self.policy.finish()
        self.stats.record(self.last, time.perf_counter() - t0)
        out = to_trl([r.sample for r in self.last], self.max_tokens, filler_id(self.tokenizer))
        self.stats.over_cap = sum(out["over_cap"])
        return out

    def league_buyers(self, jobs: list[Job], model: Any, step: int, temperature: float) -> list[Job]:
        """Refresh every league on its schedule (whether or not this step drew it) and give each league job the
        snapshot that is current: its buyer spec names the step it was taken at."""
        if not self.leagues:
            return jobs
        for league in self.leagues.values():
            old = league.spec
            if league.refresh(model, step):
                if old is not None:
                    self.runner.remove_learner(old)
                self.runner.set_learner(league.spec, league.factory(temperature))
        out = []
        for job in jobs:
            every = league_every(job.buyer)
            out.append(job if every is None else replace(job, buyer=self.leagues[every].spec))
        return out

    def learner(self, model: Any, trainer: Any) -> NegotiatorFactory:
        """Negotiators of the current policy, sampling at the trainer's temperature."""
        return self.policy.factory(self.spec, model, trainer)
