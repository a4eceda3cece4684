"""Two reference strategies: a hardliner that never moves and a seeded random negotiator."""

from __future__ import annotations

from nego.market.types import Action, Observation

from .base import ACCEPT, WALK_AWAY, RuleNegotiator, acceptable


class Hardliner(RuleNegotiator):
    """Always offers its best outcome; accepts only offers worth at least ``accept`` times its best utility."""

    def __init__(self, accept: float = 0.95, seed: int = 0) -> None:
        if not 0.0 <= accept <= 1.0:
            raise ValueError(f"accept must lie in [0, 1], got {accept}")
        super().__init__(seed)
        self.accept = accept

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        if acceptable(obs, self.accept * space.best, space):
            return ACCEPT
        return space.offer_action(space.best_index)


class RandomValid(RuleNegotiator):
    """Each turn draws an outcome uniformly from those worth at least its reservation value (from its own seed);
    accepts the standing offer if that is worth at least the drawn outcome, otherwise offers the draw."""

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        idx = space.sample_at_least(rv + 1e-9, self.rng)
        if idx is None:
            return WALK_AWAY
        if acceptable(obs, space.utility(idx), space):
            return ACCEPT
        return space.offer_action(idx)
