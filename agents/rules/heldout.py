"""Negotiators whose end game differs from time-dependent concession (held-out buyers for evaluation).

``Walker`` leaves when the other side stops moving; ``Picky`` never settles for barely-rational deals and
steers its offers toward what it believes the other side values. Both work in either role.
"""

from __future__ import annotations

import numpy as np
from nego.market.types import Action, Observation, Offer

from .base import (
    ACCEPT,
    EPS,
    WALK_AWAY,
    Clock,
    RuleNegotiator,
    acceptable,
    concession_target,
    opponent_offers,
)
from .search import OutcomeSpace

HELD_OUT_FAMILIES = ("walker", "picky")
"""Families that only evaluation plays: their code, and any parameterisation of it, never enters a training pool,
a warm start, or a default chosen on the dev split."""


class Walker(RuleNegotiator):
    """Concedes along u(t) = hi - (hi - rv) * t^(1/e) and walks away early.

    It walks away when the opponent's last ``k`` offers together raised the best own utility it has been offered
    by less than ``delta`` (a stall), or once relative time reaches ``patience``, unless the standing offer
    already meets its target (then it accepts).
    """

    def __init__(self, e: float = 1.0, k: int = 3, delta: float = 0.01, patience: float = 0.8, seed: int = 0):
        if not e > 0 or k < 1 or delta < 0 or not 0 < patience <= 1:
            raise ValueError(
                f"walker needs e > 0, k >= 1, delta >= 0, 0 < patience <= 1; got {e}, {k}, {delta}, {patience}"
            )
        super().__init__(seed)
        self.e, self.k, self.delta, self.patience = e, k, delta, patience
        self._their_u: list[float] = []

    def start(self, obs: Observation) -> None:
        self._their_u = []

    def stalled(self, obs: Observation) -> bool:
        """True if the best of the opponent's offers (in own utility) rose by less than ``delta`` over its last
        ``k`` offers."""
        theirs = opponent_offers(obs)
        u = self._their_u
        u.extend(self._space.utility_of(o) for o in theirs[len(u) :])
        if len(u) < self.k + 1:
            return False
        return max(u) - max(u[: -self.k]) < self.delta

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        if self.hopeless(space, rv):
            return WALK_AWAY
        t = Clock.OWN.time(obs)
        target = concession_target(space, max(rv, space.worst), t, self.e)
        if acceptable(obs, target, space):
            return ACCEPT
        if t >= self.patience or self.stalled(obs):
            return WALK_AWAY
        return space.offer_action(self.offer_at_least(space, target, rv))


class _FrequencyModel:
    """Estimates the opponent's linear-additive preferences from the frequencies of the values it offers.

    A value the opponent offers often is assumed good for it; an issue whose value it rarely changes between
    consecutive offers is assumed to weigh more.
    """

    def __init__(self, space: OutcomeSpace) -> None:
        self.space = space
        self.counts = [np.zeros(issue.size) for issue in space.issues]
        self.steady = np.ones(len(space.issues))
        self.last: list[int | None] | None = None
        self.n = 0

    def __deepcopy__(self, memo: dict) -> _FrequencyModel:
        new = object.__new__(_FrequencyModel)
        new.space = self.space  # shared
        new.counts = [c.copy() for c in self.counts]
        new.steady = self.steady.copy()
        new.last = None if self.last is None else list(self.last)  # of ints and Nones
        new.n = self.n
        return new

    def update(self, offer: Offer) -> None:
        pos = [self.space.grid_position(i, offer.get(issue.name)) for i, issue in enumerate(self.space.issues)]
        for i, p in enumerate(pos):
            if p is not None:
                self.counts[i][p] += 1
                if self.last is not None and self.last[i] == p:
                    self.steady[i] += 1
        self.last = pos
        self.n += 1

    def contributions(self) -> list[np.ndarray]:
        weights = self.steady / self.steady.sum()
        return [w * c / max(c.max(), 1.0) for w, c in zip(weights, self.counts, strict=True)]


class Picky(RuleNegotiator):
    """Accepts only offers worth at least ``rv + margin`` (and its current target); never lowers that bar at the
    deadline. Its target falls along u(t) = hi - (hi - (rv + margin)) * t^(1/e). Among outcomes whose own
    utility lies within ``window`` above the target it offers the one a frequency model of the opponent rates
    best (the plain nearest-above outcome before the opponent has made an offer)."""

    def __init__(self, margin: float = 0.15, e: float = 0.5, window: float = 0.05, seed: int = 0) -> None:
        if not 0 <= margin <= 1 or not e > 0 or window < 0:
            raise ValueError(f"picky needs 0 <= margin <= 1, e > 0, window >= 0; got {margin}, {e}, {window}")
        super().__init__(seed)
        self.margin, self.e, self.window = margin, e, window
        self._model: _FrequencyModel | None = None

    def start(self, obs: Observation) -> None:
        self._model = _FrequencyModel(self._space) if self._space is not None else None

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = obs.scenario.preferences.reservation
        floor = rv + self.margin
        if self.hopeless(space, floor):
            return WALK_AWAY
        target = concession_target(space, max(floor, space.worst), Clock.OWN.time(obs), self.e)
        if acceptable(obs, max(target, floor), space):
            return ACCEPT
        model = self._model
        theirs = opponent_offers(obs)
        for offer in theirs[model.n :]:
            model.update(offer)
        if model.n == 0:
            return space.offer_action(self.offer_at_least(space, target, floor))
        cand = space.candidates(max(target, floor) + EPS)
        if cand.left.size == 0:
            return space.offer_action(space.best_index)
        near = cand.utility <= cand.utility.min() + self.window
        opp_left, opp_right = space.group_sums(model.contributions())
        score = np.where(near, opp_left[cand.left] + opp_right[cand.right], -np.inf)
        k = int(np.argmax(score))
        return space.offer_action((int(cand.left[k]), int(cand.right[k])))
