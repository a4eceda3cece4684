"""Time-dependent concession (Boulware, Linear, Conceder): the target utility falls with time alone.

Target at relative time t (see :class:`~nego.agents.rules.base.Clock`)::

    u(t) = hi - (hi - lo) * t ** (1 / e),   hi = best own utility, lo = max(reservation, worst own utility)

With utilities normalised to [0, 1] this is ``1 - (1 - rv) * t^(1/e)``. ``e < 1`` concedes late (Boulware),
``e = 1`` linearly, ``e > 1`` early (Conceder).

Each turn the negotiator computes u(t) once; it accepts the standing offer if its own utility is at least u(t)
(the target of the offer it would otherwise make now), and otherwise offers the outcome whose own utility is
the smallest one at or above u(t). It never walks away unless no outcome is worth its reservation value.

Two optional parameters make it a less predictable opponent (used for training pools):

- ``margin`` raises the floor it concedes to (and accepts at) from the reservation value to ``rv + margin``;
- ``patience`` in (0, 1]: once relative time exceeds it, the negotiator walks away instead of making an
  offer (it still accepts a standing offer that meets its target). The default 1 never walks away, because
  relative time never exceeds 1. Unlike a walker it does not react to the other side's moves: it simply runs
  out of time at a round the other side cannot see;
- ``step`` in [0, 1): each offer aims at least this much own utility below its previous offer (the target is
  ``min(u(t), previous - step)``, never below the floor), so a slow schedule does not show the other side a stall
  where the grid has an outcome to concede to. The default 0 follows u(t) alone.

With the defaults this is NegMAS's time-based conceding negotiator with its "worst outcome within the aspiration
band" offer selector; with ``clock="negmas"`` it uses NegMAS's relative time as well.
"""

from __future__ import annotations

from nego.market.types import Action, Observation

from .base import (
    ACCEPT,
    EPS,
    WALK_AWAY,
    Clock,
    RuleNegotiator,
    acceptable,
    concession_target,
)
from .search import Index, OutcomeSpace

PLAN_ROUNDS = 32
"""Rounds whose (time, target, offer) a negotiator without ``step`` works out in one query when it first needs one
of them: its schedule depends on the round alone."""


class TimeDependent(RuleNegotiator):
    """Concedes along u(t) = hi - (hi - lo) * t^(1/e); see the module docstring for the exact rules."""

    def __init__(
        self,
        e: float,
        seed: int = 0,
        clock: Clock = Clock.OWN,
        margin: float = 0.0,
        patience: float = 1.0,
        step: float = 0.0,
    ) -> None:
        if not e > 0:
            raise ValueError(f"e must be positive, got {e}")
        if not 0 <= margin <= 1:
            raise ValueError(f"margin must lie in [0, 1], got {margin}")
        if not 0 < patience <= 1:
            raise ValueError(f"patience must lie in (0, 1], got {patience}")
        if not 0 <= step < 1:
            raise ValueError(f"step must lie in [0, 1), got {step}")
        super().__init__(seed)
        self.e = e
        self.clock = Clock(clock)
        self.margin = margin
        self.patience = patience
        self.step = step
        self._last: float | None = None  # own utility of its previous offer in this negotiation
        self._plan: dict[int, tuple[float, bool, Index]] = {}  # round -> (accept bar, walks, offer), without step

    def start(self, obs: Observation) -> None:
        self._last = None
        self._plan = {}

    def floor(self, obs: Observation) -> float:
        """The lowest own utility it will ever accept or offer: reservation plus margin."""
        return obs.scenario.preferences.reservation + self.margin

    def target(self, obs: Observation) -> float:
        return self._target(self.space(obs), self.floor(obs), self.clock.time(obs))

    def _target(self, space: OutcomeSpace, floor: float, t: float) -> float:
        return concession_target(space, max(floor, space.worst), t, self.e)

    async def act(self, obs: Observation) -> Action:
        planned = self._plan.get(obs.round) if obs.scenario is self._view else None
        if planned is None:
            space = self.space(obs)
            floor = self.floor(obs)
            if self.hopeless(space, floor):
                return WALK_AWAY
            if self.step:
                return self._act_stepping(obs, space, floor)
            planned = self._plan_from(obs, space, floor)
        bar, walk, index = planned
        standing = obs.standing_offer
        if standing is not None and self._space.utility_of(standing) >= bar:  # what ``acceptable`` decides
            return ACCEPT
        return WALK_AWAY if walk else self._space.offer_action(index)

    def _act_stepping(self, obs: Observation, space: OutcomeSpace, floor: float) -> Action:
        t = self.clock.time(obs)
        target = self._target(space, floor, t)
        if self._last is not None:
            target = min(target, self._last - self.step)
        if acceptable(obs, max(target, floor), space):
            return ACCEPT
        if t > self.patience:
            return WALK_AWAY
        index = self.offer_at_least(space, target, floor)
        self._last = space.utility(index)
        return space.offer_action(index)

    def _plan_from(self, obs: Observation, space: OutcomeSpace, floor: float) -> tuple[float, bool, Index]:
        """Plan this round and up to ``PLAN_ROUNDS - 1`` after it, each as (the least own utility it accepts, whether
        it walks away instead of offering, the offer it makes): the same decisions as working each out on its turn."""
        n = obs.scenario.max_rounds
        rounds = range(obs.round, max(obs.round, min(n, obs.round + PLAN_ROUNDS - 1)) + 1)
        at, patience, rv = self.clock.at, self.patience, obs.scenario.preferences.reservation
        # concession_target and cheapest_at_least, term for term
        best, inverse = space.best, 1.0 / self.e
        span = best - max(floor, space.worst)
        times = [at(r, n) for r in rounds]
        targets = [best - span * t**inverse for t in times]
        low = floor + EPS
        found = space.at_least_many([max(target - EPS, low) for target in targets])
        self._plan.update(
            (r, (max(target, floor, rv), t > patience, space.best_index if index is None else index))
            for r, t, target, index in zip(rounds, times, targets, found, strict=True)
        )
        return self._plan[obs.round]
