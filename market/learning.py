"""Learners: plugins that trade under a seller spec in a market and learn from their own negotiations between days.

A :class:`~nego.market.population.MarketModel` given learners runs its days as usual, and:

1. every day, the sellers trading under a learner's :attr:`Learner.spec` are played by ``learner.factory()``: the
   learner's current policy;
2. each pair whose seller is a learner plays its scenario :attr:`Learner.group_size` times against the same buyer,
   with seeds derived from the pair's seed: the first negotiation is the market's own (it is settled and counted like
   every other), the others are rollouts of the same situation, played for learning only (arm ``rollout`` in the
   transcripts). The pair's negotiations are one :class:`LearningGroup`: one prompt, several outcomes, which is what a
   group-relative method such as GRPO needs;
3. ``learner.score(job, result)`` is the reward of each of its negotiations; it is written to the transcripts;
4. after the day, ``learner.learn(day, groups)`` gets that day's groups and returns a :class:`LearnReport`. It may
   update its policy any number of times (or keep groups for later: the policy lag is its to record) and must have
   saved its state before returning, so that after a crash ``learner.resume()`` returns that day;
5. the next day's negotiations are played by whatever ``factory()`` returns then.

On a rerun of a killed simulation the model asks every learner for the last day it learned from, drops the
transcripts of later days (they are played again, by the restored policy) and replays the earlier days from the
transcripts without calling ``learn``. Nothing here imports a training library: a learner can be a GRPO trainer, a
bandit or a rule tuner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .marketplace import Job, NegotiatorFactory, Played
    from .types import NegotiationResult

ROLLOUT_ARM = "rollout"
"""Arm of the extra negotiations a learning pair plays for learning only (not settled, not in the market's counts)."""


@dataclass(frozen=True, slots=True)
class LearningGroup:
    """One learning pair's negotiations of one day: same scenario, same buyer, ``group_size`` seeds. ``episodes[0]``
    is the market's negotiation; every episode carries the learner's record and reward."""

    day: int
    pair: int
    episodes: tuple[Played, ...]


@dataclass(frozen=True, slots=True)
class LearnReport:
    """What one call of :meth:`Learner.learn` did."""

    policy_version: int
    """Updates the policy has had after this call: the version that plays the next day."""
    updates: int = 0
    """Policy updates this call made."""
    pending: int = 0
    """Groups kept for a later update."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Anything worth showing per day (loss, mean reward of the batches, mean policy lag, ...)."""


@runtime_checkable
class Learner(Protocol):
    """The RL plugin interface. See the module docstring for when each member is used."""

    spec: str
    """The seller spec its agents trade under (a name of its own, not resolved by the agent registry)."""
    group_size: int
    """Negotiations per learning pair per day (>= 1)."""

    @property
    def policy_version(self) -> int: ...

    def factory(self) -> NegotiatorFactory:
        """Negotiators of the current policy (a :class:`~nego.market.marketplace.Recorder` to receive records)."""
        ...

    def score(self, job: Job, result: NegotiationResult) -> float | None:
        """The reward of one of its negotiations (None: not one to learn from)."""
        ...

    def learn(self, day: int, groups: Sequence[LearningGroup]) -> LearnReport:
        """Learn from the day's groups; save state before returning."""
        ...

    def resume(self) -> int:
        """Restore the last saved state; return the last day learned from (0 if none)."""
        ...

    def close(self) -> None: ...
