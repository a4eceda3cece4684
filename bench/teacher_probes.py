"""Variants of the tiny seller's teacher (``timedep:e=0.2,step=0.05``) as a plugin seller, to be played beside the
rule sellers on the dev split with ``bench/seller_table.py`` (never on the held-out suite or buyers).

The seller aims at the time-dependent target ``u(t) = best - (best - max(rv, worst)) * t^(1/e)``, at least ``step``
below its previous offer, then:

- ``k``: concedes ``k`` times each gain of the buyer's latest offer over its previous one (in own utility), summed over
  the negotiation (reciprocity on top of the clock);
- ``slack``: accepts a standing offer within ``slack`` below the target;
- ``opening``: never aims above ``rv + opening * (best - rv)`` (an opening below the best outcome).

With ``k = slack = 0`` and ``opening = 1`` it plays as the teacher. Run from the repository root::

    PYTHONPATH=bench python bench/seller_table.py --n 64 \\
        --rules "timedep:e=0.2,step=0.05,py:teacher_probes:seller:k=0.5,py:teacher_probes:seller:opening=0.9"
"""

from __future__ import annotations

from nego.agents.rules.base import ACCEPT, WALK_AWAY, acceptable, opponent_offers
from nego.agents.rules.timedep import TimeDependent
from nego.market.types import Action, Observation


class TeacherVariant(TimeDependent):
    """The teacher (a :class:`TimeDependent` with a step) with reciprocity ``k``, acceptance ``slack`` and an
    ``opening`` cap on top."""

    def __init__(
        self,
        e: float = 0.2,
        step: float = 0.05,
        k: float = 0.0,
        slack: float = 0.0,
        opening: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(e, seed=seed, step=step)
        self.k, self.slack, self.opening = k, slack, opening
        self._given = 0.0
        self._seen = 0

    def start(self, obs: Observation) -> None:
        super().start(obs)
        self._given, self._seen = 0.0, 0

    async def act(self, obs: Observation) -> Action:
        space = self.space(obs)
        rv = self.floor(obs)
        if self.hopeless(space, rv):
            return WALK_AWAY
        theirs = opponent_offers(obs)
        if self.k and len(theirs) >= 2 and len(theirs) > self._seen:
            self._given += self.k * max(0.0, space.utility_of(theirs[-1]) - space.utility_of(theirs[-2]))
        self._seen = len(theirs)
        target = self._target(space, rv, self.clock.time(obs)) - self._given
        if self.step and self._last is not None:
            target = min(target, self._last - self.step)
        target = max(min(target, rv + self.opening * (space.best - rv)), rv)
        if acceptable(obs, max(target - self.slack, rv), space):
            return ACCEPT
        index = self.offer_at_least(space, target, rv)
        self._last = space.utility(index)
        return space.offer_action(index)


def seller(role: str, seed: int, **params: str) -> TeacherVariant:
    """The plugin factory (``py:teacher_probes:seller:key=value,...``)."""
    return TeacherVariant(seed=seed, **{key: float(value) for key, value in params.items()})
