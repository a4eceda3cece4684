"""What every rule-based negotiator shares: its own RNG, a lazily built outcome space, clocks and guards.

A rule-based negotiator is built for one negotiation (the registry's factory is called once per negotiation)
and reads nothing but the :class:`Observation` it is handed.
"""

from __future__ import annotations

import copy
from enum import StrEnum

import numpy as np
from nego.market.types import Action, ActionKind, Observation, Offer
from nego.scenarios.scenario import ScenarioView

from .search import Index, OutcomeSpace, shared_space

EPS = 1e-9
"""Utility tolerance: offers clear the reservation value by EPS (so float rounding never puts one below it) and
outcomes within EPS below a target count as reaching it."""


class Clock(StrEnum):
    """How a negotiator turns (round, max_rounds) into relative time t in [0, 1].

    ``own``: t = (round - 1) / (max_rounds - 1): 0 at the first own turn, 1 at the last (1 if max_rounds is 1).
    ``negmas``: t = round / (max_rounds + 1), NegMAS's step-based relative time for alternating offers with one
    turn per side per step (it never reaches 0 or 1); offered for like-for-like comparisons with NegMAS.
    """

    OWN = "own"
    NEGMAS = "negmas"

    def time(self, obs: Observation) -> float:
        return self.at(obs.round, obs.scenario.max_rounds)

    def at(self, round_: int, max_rounds: int) -> float:
        """Relative time of round ``round_`` out of ``max_rounds``."""
        if self is Clock.NEGMAS:
            return round_ / (max_rounds + 1)
        return 1.0 if max_rounds <= 1 else min(1.0, (round_ - 1) / (max_rounds - 1))


_AS_IS = frozenset({int, float, str, bool, type(None), ScenarioView, OutcomeSpace})
"""Types a copied rule negotiator keeps as they are: immutable values, its view (a rule negotiator starts afresh on a
view it does not know) and its outcome space (shared)."""


class RuleNegotiator:
    """Base of the rule-based strategies: seeded RNG and the own outcome space, rebuilt for each new scenario view."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng: np.random.Generator | None = None
        self._view: ScenarioView | None = None
        self._space: OutcomeSpace | None = None

    @property
    def rng(self) -> np.random.Generator:
        """The negotiator's own random stream, seeded with its seed (made on first use: most rules never draw)."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng

    def space(self, obs: Observation) -> OutcomeSpace:
        """The own outcome space of this negotiation, computed on first use."""
        if obs.scenario is not self._view or self._space is None:
            self._view = obs.scenario
            self._space = shared_space(obs.scenario.issues, obs.scenario.preferences)
            self.start(obs)
        return self._space

    def start(self, obs: Observation) -> None:
        """Hook: reset per-negotiation state when a new scenario view shows up."""

    def __deepcopy__(self, memo: dict) -> RuleNegotiator:
        """A copy that plays on exactly as this negotiator would from here (an optimality-gap probe asks copies): its
        numbers, view and outcome space are immutable or shared and stay as they are; the rest is copied deeply."""
        new = object.__new__(type(self))
        memo[id(self)] = new
        state = new.__dict__
        for name, value in self.__dict__.items():
            state[name] = value if type(value) in _AS_IS else copy.deepcopy(value, memo)
        return new

    @staticmethod
    def hopeless(space: OutcomeSpace, rv: float) -> bool:
        """True if no outcome is worth the reservation value (then the only rational move is to walk away)."""
        return space.best < rv + EPS

    def offer_at_least(self, space: OutcomeSpace, target: float, rv: float) -> Index:
        return cheapest_at_least(space, target, rv)


def cheapest_at_least(space: OutcomeSpace, target: float, rv: float) -> Index:
    """The outcome with the smallest own utility at or above ``max(target, rv)`` (the best one if none is).

    Ties with ``target`` within EPS count as reaching it; the reservation value must be cleared by EPS."""
    idx = space.at_least(max(target - EPS, rv + EPS))
    return space.best_index if idx is None else idx


def concession_target(space: OutcomeSpace, lo: float, t: float, e: float) -> float:
    """The time-dependent target u(t) = best - (best - lo) * t ** (1 / e) between the best own utility and ``lo``
    (``e < 1`` concedes late, ``e > 1`` early)."""
    return space.best - (space.best - lo) * t ** (1.0 / e)


def opponent_offers(obs: Observation) -> list[Offer]:
    """The other side's offers so far, oldest first."""
    me = obs.scenario.role
    return [m.offer for m in obs.history if m.role is not me and m.kind is ActionKind.OFFER and m.offer is not None]


def acceptable(obs: Observation, threshold: float, space: OutcomeSpace) -> bool:
    """True if an offer from the other side stands and is worth at least ``threshold`` (and the reservation)."""
    offer = obs.standing_offer
    if offer is None:
        return False
    return space.utility_of(offer) >= max(threshold, obs.scenario.preferences.reservation)


ACCEPT = Action(ActionKind.ACCEPT)
WALK_AWAY = Action(ActionKind.WALK_AWAY)
