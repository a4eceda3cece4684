"""An outside-option negotiator: it has a better alternative than its reservation value and leaves for it as soon
as the other side's offers are not heading above it in time.

At the start of each negotiation it draws, from its own seed, the share ``g`` uniformly from ``[low, high]``; its
outside option is then ``rv + g * (best - rv)`` in own utility (``best`` = its best outcome). The other side cannot
see it, and a training pool gets a different one every negotiation even with fixed parameters.

Each turn:

1. it accepts a standing offer worth at least its outside option;
2. once it has seen at least ``min_offers`` offers from the other side, it forecasts the own utility of the offer
   that will stand at its last turn: a weighted least-squares line through the own utilities of the other side's
   offers (an offer ``k`` places back weighs ``memory ** k``), extended by the number of offers still to come
   before that turn. If the forecast is below the outside option, it walks away;
3. otherwise it offers along ``u(t) = best - (best - outside) * t^(1/e)``, never below its outside option.

A side that concedes steadily keeps it at the table; one that stalls, or concedes on issues it does not care about,
is left as soon as the trend shows it.
"""

from __future__ import annotations

from nego.market.types import Action, Observation

from .base import ACCEPT, WALK_AWAY, Clock, RuleNegotiator, acceptable, concession_target
from .concession import OpponentOffers, weighted_trend


class OutsideOption(RuleNegotiator):
    """Accepts anything worth its private outside option; walks away when the other side's trend, extrapolated
    to its last turn, stays below it."""

    def __init__(
        self,
        low: float = 0.1,
        high: float = 0.5,
        e: float = 1.0,
        memory: float = 0.7,
        min_offers: float = 3.0,
        seed: int = 0,
    ) -> None:
        if not 0 <= low <= high <= 1:
            raise ValueError(f"outside needs 0 <= low <= high <= 1, got low={low}, high={high}")
        if not e > 0:
            raise ValueError(f"e must be positive, got {e}")
        if not 0 < memory <= 1:
            raise ValueError(f"memory must lie in (0, 1], got {memory}")
        if not min_offers >= 1:
            raise ValueError(f"min_offers must be at least 1, got {min_offers}")
        super().__init__(seed)
        self.low, self.high, self.e, self.memory, self.min_offers = low, high, e, memory, min_offers
        self.outside = 1.0
        self._offers: OpponentOffers | None = None

    def start(self, obs: Observation) -> None:
        rv = obs.scenario.preferences.reservation
        share = float(self.rng.uniform(self.low, self.high))
        self.outside = rv + share * max(0.0, self._space.best - rv)
        self._offers = OpponentOffers(self._space)

    def forecast(self, obs: Observation) -> float:
        """Own utility of the offer the trend says will stand at its last turn (needs one offer seen)."""
        level, slope = weighted_trend(self._offers.utilities, self.memory)
        return level + slope * (obs.rounds_left - 1)

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        if acceptable(obs, self.outside, space):
            return ACCEPT
        self._offers.update(obs)
        if len(self._offers.utilities) >= self.min_offers and self.forecast(obs) < self.outside:
            return WALK_AWAY
        target = concession_target(space, self.outside, Clock.OWN.time(obs), self.e)
        return space.offer_action(self.offer_at_least(space, target, rv))
