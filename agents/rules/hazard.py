"""A stochastic quitter: each turn it may leave, with a probability that grows the less the other side has been
conceding lately and the later it is.

Its pace is an exponential moving average of the other side's concessions per offer, in own utility (each offer's
gain over the best earlier one, negative for a retreat, see :mod:`nego.agents.rules.concession`; ``memory`` is the
weight kept by the old average). From the pace and relative time ``t`` (see :class:`~nego.agents.rules.base.Clock`) it
computes the hazard::

    stall  = clip(1 - pace / expect, 0, 1)        # 0 at or above the expected concession per offer, 1 at none
    hazard = quit * stall * (1 + t) / 2

and leaves if this turn's uniform draw is below it. The draws, one per round, come from its own seed at the start of
the negotiation, so the same seed and the same moves give the same decisions. Before the other side has made two
offers there is no pace and no hazard.

Otherwise it plays time-dependent concession: it accepts a standing offer worth at least its target
``u(t) = best - (best - max(rv, worst)) * t^(1/e)`` (before it considers leaving) and offers the outcome of smallest
own utility at or above that target.
"""

from __future__ import annotations

import numpy as np
from nego.market.types import Action, Observation

from .base import ACCEPT, WALK_AWAY, Clock, RuleNegotiator, acceptable, concession_target
from .concession import OpponentOffers


class Hazard(RuleNegotiator):
    """Concedes time-dependently; each turn leaves with probability ``quit * stall * (1 + t) / 2``."""

    def __init__(
        self, quit: float = 0.3, expect: float = 0.03, memory: float = 0.5, e: float = 1.0, seed: int = 0
    ) -> None:
        if not 0 <= quit <= 1:
            raise ValueError(f"quit must lie in [0, 1], got {quit}")
        if not expect > 0:
            raise ValueError(f"expect must be positive, got {expect}")
        if not 0 <= memory < 1:
            raise ValueError(f"memory must lie in [0, 1), got {memory}")
        if not e > 0:
            raise ValueError(f"e must be positive, got {e}")
        super().__init__(seed)
        self.quit, self.expect, self.memory, self.e = quit, expect, memory, e
        self.pace: float | None = None
        self._draws = np.zeros(0)
        self._offers: OpponentOffers | None = None

    def start(self, obs: Observation) -> None:
        self.pace = None
        self._draws = self.rng.random(obs.scenario.max_rounds)
        self._offers = OpponentOffers(self._space)

    def hazard(self, t: float) -> float:
        """Probability of leaving this turn, at relative time ``t``, given the current pace (0 without one)."""
        if self.pace is None:
            return 0.0
        stall = min(1.0, max(0.0, 1.0 - self.pace / self.expect))
        return self.quit * stall * (1.0 + t) / 2.0

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        t = Clock.OWN.time(obs)
        target = concession_target(space, max(rv, space.worst), t, self.e)
        if acceptable(obs, target, space):
            return ACCEPT
        for step in self._offers.update(obs):
            self.pace = step if self.pace is None else self.memory * self.pace + (1.0 - self.memory) * step
        if self._draws[min(obs.round, len(self._draws)) - 1] < self.hazard(t):
            return WALK_AWAY
        return space.offer_action(self.offer_at_least(space, target, rv))
