"""A negotiator with a private deadline: it concedes quickly towards it and is gone once it has passed.

At the start of each negotiation it draws its deadline ``d`` (in relative time, see
:class:`~nego.agents.rules.base.Clock`) uniformly from ``[early, late]`` with its own seed. Until then it concedes
along a clock compressed to that deadline::

    u(t) = best - (best - max(rv, worst)) * min(1, t / d) ^ (1 / e)

so it reaches its reservation value at its deadline. Each turn it accepts a standing offer worth at least u(t);
from its deadline on it walks away instead of making an offer. A side that waits for the end finds it gone; one
that takes its generous offers before the deadline closes.

Unlike ``timedep`` with ``patience`` (a fixed parameter, and a target still high when it leaves), the deadline
differs in every negotiation and the concession is timed to use all of it.
"""

from __future__ import annotations

from nego.market.types import Action, Observation

from .base import ACCEPT, WALK_AWAY, Clock, RuleNegotiator, acceptable, concession_target


class Deadline(RuleNegotiator):
    """Concedes to its reservation value by a private deadline drawn per negotiation, then walks away."""

    def __init__(self, early: float = 0.4, late: float = 1.0, e: float = 2.0, seed: int = 0) -> None:
        if not 0 < early <= late <= 1:
            raise ValueError(f"deadline needs 0 < early <= late <= 1, got early={early}, late={late}")
        if not e > 0:
            raise ValueError(f"e must be positive, got {e}")
        super().__init__(seed)
        self.early, self.late, self.e = early, late, e
        self.deadline = late

    def start(self, obs: Observation) -> None:
        self.deadline = float(self.rng.uniform(self.early, self.late))

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        t = Clock.OWN.time(obs)
        tau = min(1.0, t / self.deadline)
        target = concession_target(space, max(rv, space.worst), tau, self.e)
        if acceptable(obs, target, space):
            return ACCEPT
        if t >= self.deadline:
            return WALK_AWAY
        return space.offer_action(self.offer_at_least(space, target, rv))
