"""The RL plugin's episode runner: learning negotiators play through the market, their records come back typed.

Everything training plays (GRPO rollouts, behaviour-cloning transcripts, dev evaluations) is a list of
:class:`~nego.market.marketplace.Job` s handed to one :class:`~nego.market.marketplace.Marketplace`: the same
seeding (``child_seeds``), concurrency caps, events and Parquet transcripts as ``nego simulate``. The runner only
adds what a learner needs on top: the learner's own factory under its spec, a long-lived event loop (the trainer
calls in synchronously), and each learning seller's :class:`~nego.agents.trace.TokenTrace` beside its result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nego.agents import NegotiatorFactory
from nego.agents.registry import resolve
from nego.agents.trace import TokenTrace
from nego.market.marketplace import Job, Marketplace, Played, Scorer
from nego.market.types import EndReason, NegotiationResult
from nego.scenarios.scenario import Role

if TYPE_CHECKING:
    from nego.market.events import EventBus
    from nego.market.transcripts import TranscriptWriter


@dataclass(frozen=True, slots=True)
class Sample:
    """What a policy update trains on from one negotiation: the seller's tokens, the reward, and who played it."""

    negotiation_id: str
    scenario_id: str
    trace: TokenTrace
    reward: float
    policy_version: int = 0


@dataclass(frozen=True, slots=True)
class Rollout:
    """One negotiation a learning seller played: the job, its result, the seller's token trace and the reward."""

    job: Job
    result: NegotiationResult
    trace: TokenTrace
    reward: float

    @property
    def seller_turns(self) -> int:
        return sum(1 for t in self.result.turns if t.role is Role.SELLER)

    @property
    def sample(self) -> Sample:
        version = self.job.policy_version or 0
        return Sample(self.job.negotiation_id, self.job.scenario.id, self.trace, self.reward, version)


class EpisodeRunner:
    """Plays jobs on one :class:`Marketplace` and one event loop for its whole life (clients and batchers stay bound
    to it). ``learners`` maps the specs of learning negotiators to their factories; every other spec resolves through
    the agent registry. Use as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        learners: Mapping[str, NegotiatorFactory] | None = None,
        *,
        writer: TranscriptWriter | None = None,
        bus: EventBus | None = None,
        scorer: Scorer | None = None,
        concurrency: int = 1024,
        resolver: Callable[[str], NegotiatorFactory] = resolve,
    ) -> None:
        self.learners = dict(learners or {})
        self._resolver = resolver
        self.market = Marketplace(self._factory, concurrency=concurrency, bus=bus, writer=writer, scorer=scorer)
        self._loop = asyncio.Runner()

    def _factory(self, spec: str) -> NegotiatorFactory:
        return self.learners[spec] if spec in self.learners else self._resolver(spec)

    def set_learner(self, spec: str, factory: NegotiatorFactory) -> None:
        """Play ``spec`` with ``factory`` from now on (a new policy version, a policy with other sampling)."""
        self.learners[spec] = factory
        self.market.forget(spec)

    def remove_learner(self, spec: str) -> None:
        """Stop playing ``spec`` with a learner's factory (a league snapshot that was replaced)."""
        self.learners.pop(spec, None)
        self.market.forget(spec)

    def play(self, jobs: Sequence[Job], *, concurrency: int = 0) -> list[Played]:
        """Play (or read back) every job; results in job order. ``concurrency`` (0: the market's own) caps the
        negotiations in flight for these jobs only."""
        if not concurrency:
            return self._loop.run(self.market.play(jobs))
        own, self.market.concurrency = self.market.concurrency, min(concurrency, self.market.concurrency)
        try:
            return self._loop.run(self.market.play(jobs))
        finally:
            self.market.concurrency = own

    def rollouts(self, jobs: Sequence[Job]) -> list[Rollout]:
        """Play jobs whose seller is a learner and return its traces; every job must be played now (a result read
        back from transcripts has no trace, so a learner never trains on one)."""
        out = []
        for p in self.play(jobs):
            if not isinstance(p.seller_record, TokenTrace):
                raise RuntimeError(
                    f"negotiation {p.job.negotiation_id} came back without the seller's trace "
                    f"({'read back from the transcripts' if not p.fresh else 'its seller keeps no record'})"
                )
            if p.result.outcome.end_reason is EndReason.ERROR:
                raise RuntimeError(
                    f"training negotiation {p.job.negotiation_id} ended in an error, which has no reward to learn "
                    f"from: {p.result.outcome.error}"
                )
            out.append(Rollout(p.job, p.result, p.seller_record, 0.0 if p.reward is None else p.reward))
        return out

    def close(self) -> None:
        self._loop.run(self.market.aclose())
        self._loop.close()

    def __enter__(self) -> EpisodeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
