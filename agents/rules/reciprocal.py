"""A reciprocating negotiator: it concedes only in answer to the other side's concessions, and hardens otherwise.

It starts at its best outcome. Each new offer of the other side is compared, in own utility, with the best offer
that side has made before (see :mod:`nego.agents.rules.concession`):

- a concession, a gain ``d > tol``, lowers its target by ``r * d`` (never below its reservation value);
- anything else (a repeat, a token step of at most ``tol``, a retreat, a return to ground already offered) raises
  its target by ``harden`` times the distance to its best utility: ``harden = 0`` merely stops conceding,
  ``harden = 1`` goes back to its best.

It accepts a standing offer worth at least its own next offer, and otherwise makes that offer (the outcome of
smallest own utility at or above the target). It never walks away unless no outcome is worth its reservation
value, and it has no end-game concession: against a side that stops conceding, the deadline comes with the
target where the last concession left it, or higher.

Unlike tit-for-tat (``tft``), which ignores a retreat and takes any rational offer on its last turn, this one
answers every stall by moving away and counts only new ground, so time spent not conceding costs the other side
utility.
"""

from __future__ import annotations

from nego.market.types import Action, Observation

from .base import ACCEPT, EPS, WALK_AWAY, RuleNegotiator, acceptable
from .concession import OpponentOffers


class Reciprocal(RuleNegotiator):
    """Concedes ``r`` times each concession of the other side (in own utility); hardens by ``harden`` on a stall."""

    def __init__(self, r: float = 1.0, harden: float = 0.2, tol: float = 0.005, seed: int = 0) -> None:
        if not r > 0:
            raise ValueError(f"r must be positive, got {r}")
        if not 0 <= harden <= 1:
            raise ValueError(f"harden must lie in [0, 1], got {harden}")
        if not 0 <= tol < 1:
            raise ValueError(f"tol must lie in [0, 1), got {tol}")
        super().__init__(seed)
        self.r, self.harden, self.tol = r, harden, tol
        self._target = 1.0
        self._offers: OpponentOffers | None = None

    def start(self, obs: Observation) -> None:
        self._target = self._space.best
        self._offers = OpponentOffers(self._space)

    @property
    def target(self) -> float:
        """The own utility its next offer aims at."""
        return self._target

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        for step in self._offers.update(obs):
            if step > self.tol:
                self._target = max(rv, self._target - self.r * step)
            else:
                self._target += self.harden * (space.best - self._target)
        index = self.offer_at_least(space, self._target, rv)
        if acceptable(obs, space.utility(index) - EPS, space):
            return ACCEPT
        return space.offer_action(index)
