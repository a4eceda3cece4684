"""Time-dependent concession (Boulware, Linear, Conceder): the target utility falls with time alone.

Target at relative time t (see :class:`~nego.agents.rulebase.Clock`)::

    u(t) = hi - (hi - lo) * t ** (1 / e),   hi = best own utility, lo = max(reservation, worst own utility)

With utilities normalised to [0, 1] this is ``1 - (1 - rv) * t^(1/e)``. ``e < 1`` concedes late (Boulware),
``e = 1`` linearly, ``e > 1`` early (Conceder).

Each turn the negotiator computes u(t) once; it accepts the standing offer if its own utility is at least u(t)
(the target of the offer it would otherwise make now), and otherwise offers the outcome whose own utility is
the smallest one at or above u(t). It never walks away unless no outcome is worth its reservation value.
This is NegMAS's time-based conceding negotiator with its "worst outcome within the aspiration band" offer
selector; with ``clock="negmas"`` it uses NegMAS's relative time as well.
"""

from __future__ import annotations

from nego.market.types import Action, Observation

from .rulebase import ACCEPT, WALK_AWAY, Clock, RuleNegotiator, acceptable, offer_action


class TimeDependent(RuleNegotiator):
    """Concedes along u(t) = hi - (hi - lo) * t^(1/e); see the module docstring for the exact rules."""

    def __init__(self, e: float, seed: int = 0, clock: Clock = Clock.OWN) -> None:
        if not e > 0:
            raise ValueError(f"e must be positive, got {e}")
        super().__init__(seed)
        self.e = e
        self.clock = Clock(clock)
        self._power = 1.0 / e

    def target(self, obs: Observation) -> float:
        space = self.space(obs)
        lo = max(obs.scenario.preferences.reservation, space.worst)
        hi = space.best
        return hi - (hi - lo) * self.clock.time(obs) ** self._power

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        target = self.target(obs)
        if acceptable(obs, target, space):
            return ACCEPT
        return offer_action(space, self.offer_at_least(space, target, rv))
