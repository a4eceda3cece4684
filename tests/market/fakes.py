"""Small seeded negotiators and factories for marketplace tests (test doubles, not product agents)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
from nego.market.types import Action, Observation, Usage
from nego.scenarios.scenario import Role


class Conceder:
    """Concedes linearly from 1 to its reservation; offers a random grid point near its target, accepts a standing
    offer worth at least its target. Randomness comes only from its seed. ``delay`` awaits per move."""

    def __init__(self, seed: int, delay: float = 0.0, invalid_first: bool = False, tokens: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.delay = delay
        self.invalid_first = invalid_first
        self.tokens = tokens

    async def act(self, obs: Observation) -> Action:
        if self.delay:
            await asyncio.sleep(self.delay)
        view = obs.scenario
        usage = Usage(prompt_tokens=self.tokens, completion_tokens=1, calls=1) if self.tokens else None
        if self.invalid_first and obs.round == 1 and obs.attempt == 0:
            return Action.invalid("???", "could not parse the reply", usage)
        progress = (obs.round - 1) / max(1, view.max_rounds - 1)
        target = 1.0 - progress * (1.0 - view.preferences.reservation)
        if obs.standing_offer is not None and view.utility(obs.standing_offer) >= target:
            return Action.accept("deal")
        best, best_gap = None, float("inf")
        for _ in range(12):
            offer = {i.name: i.grid()[int(self.rng.integers(i.size))] for i in view.issues}
            gap = abs(view.utility(offer) - target)
            if gap < best_gap:
                best, best_gap = offer, gap
        action = Action.make_offer(best, f"round {obs.round}")
        return Action(action.kind, action.offer, action.message, usage=usage)


@dataclass
class Factory:
    """A structural NegotiatorFactory: ``spec``, ``kind`` and ``__call__(role, seed)``."""

    spec: str
    kind: str = "rule"
    delay: float = 0.0
    invalid_first: bool = False
    tokens: int = 0
    built: list[tuple[Role, int]] = field(default_factory=list)

    def __call__(self, role: Role, seed: int) -> Conceder:
        self.built.append((role, seed))
        return Conceder(seed, self.delay, self.invalid_first, self.tokens)


class Gauge:
    """Counts negotiations in flight per kind and remembers the maxima."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    def enter(self, key: str) -> None:
        self.now[key] = self.now.get(key, 0) + 1
        self.peak[key] = max(self.peak.get(key, 0), self.now[key])

    def leave(self, key: str) -> None:
        self.now[key] -= 1


class Counted:
    """Wraps a negotiator: registers with a gauge under its kind (and 'all') while a call is in progress."""

    def __init__(self, inner: Conceder, gauge: Gauge, kind: str) -> None:
        self.inner, self.gauge, self.kind = inner, gauge, kind

    async def act(self, obs: Observation) -> Action:
        self.gauge.enter(self.kind)
        try:
            await asyncio.sleep(0.001)
            return await self.inner.act(obs)
        finally:
            self.gauge.leave(self.kind)


@dataclass
class CountedFactory:
    spec: str
    kind: str
    gauge: Gauge

    def __call__(self, role: Role, seed: int) -> Counted:
        return Counted(Conceder(seed), self.gauge, self.kind)


class Broken:
    async def act(self, obs: Observation) -> Action:
        raise ConnectionError("backend down")


@dataclass
class BrokenFactory:
    spec: str = "broken"
    kind: str = "remote"

    def __call__(self, role: Role, seed: int) -> Broken:
        return Broken()


def factories(*specs: str, **options: object) -> dict[str, Factory]:
    return {s: Factory(s, **options) for s in specs}  # type: ignore[arg-type]
