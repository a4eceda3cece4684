"""Relative tit-for-tat: concede in own utility as much as the opponent just conceded, measured in own utility."""

from __future__ import annotations

from nego.market.types import Action, Observation

from .base import ACCEPT, WALK_AWAY, RuleNegotiator, acceptable, opponent_offers


class TitForTat(RuleNegotiator):
    """Starts at its best outcome. Whenever the opponent's latest offer is worth ``d > 0`` more to it than the
    opponent's previous one, it lowers its own target by ``k * d`` (never below its reservation value); an
    opponent that retreats is not punished. It accepts an offer worth at least its current target, and on its
    last turn any offer worth at least its reservation value."""

    def __init__(self, k: float = 1.0, seed: int = 0) -> None:
        if not k >= 0:
            raise ValueError(f"k must be non-negative, got {k}")
        super().__init__(seed)
        self.k = k
        self._target = 1.0
        self._seen = 0

    def start(self, obs: Observation) -> None:
        self._target = self._space.best if self._space is not None else 1.0
        self._seen = 0

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        view = obs.scenario
        rv = view.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        theirs = opponent_offers(obs)
        if len(theirs) >= 2 and len(theirs) > self._seen:
            gain = space.utility_of(theirs[-1]) - space.utility_of(theirs[-2])
            if gain > 0:
                self._target = max(rv, self._target - self.k * gain)
        self._seen = len(theirs)
        if acceptable(obs, rv if obs.is_last_turn else self._target, space):
            return ACCEPT
        return space.offer_action(self.offer_at_least(space, self._target, rv))
