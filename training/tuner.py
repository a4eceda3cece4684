"""A rule tuner: the smallest learner that plugs into the market (see :mod:`nego.market.learning`).

It trades as a time-dependent seller whose concession exponent ``e`` it picks per negotiation from a few arms, and
learns between days which arm pays, by upper confidence bounds on the mean reward (the seller's utility; the
reservation without a deal). No model, no torch: it shows what the interface asks of a learner, and it is a fair
non-neural baseline for a learning seller in the same market.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from nego.agents.rules.timedep import TimeDependent
from nego.market.learning import LearningGroup, LearnReport
from nego.market.marketplace import Job
from nego.market.types import Action, EndReason, NegotiationResult, Observation
from nego.scenarios.scenario import Role

ARMS = (0.2, 0.5, 1.0, 2.0, 4.0)
STATE = "tuner.json"


class _TunedSeller:
    """A time-dependent seller playing the arm its factory chose for this negotiation; records the arm."""

    def __init__(self, arm: int, seed: int) -> None:
        self.arm = arm
        self.inner = TimeDependent(ARMS[arm], seed=seed)

    async def act(self, obs: Observation) -> Action:
        return await self.inner.act(obs)

    def record(self, result: NegotiationResult) -> int:
        return self.arm


@dataclass
class _TunerFactory:
    spec: str
    choose: object
    kind: str = "rule"

    def __call__(self, role: Role, seed: int) -> _TunedSeller:
        return _TunedSeller(self.choose(seed), seed)  # type: ignore[operator]


@dataclass
class ConcessionTuner:
    """UCB over the concession exponents in :data:`ARMS`; saves its counts under ``directory`` after every day."""

    directory: Path
    spec: str = "tuner"
    group_size: int = 1
    exploration: float = 0.5
    counts: list[int] = field(default_factory=lambda: [0] * len(ARMS))
    totals: list[float] = field(default_factory=lambda: [0.0] * len(ARMS))
    day: int = 0
    version: int = 0

    @property
    def policy_version(self) -> int:
        return self.version

    def choose(self, seed: int) -> int:
        """The arm with the highest upper confidence bound; untried arms first, ties broken by the seed."""
        n = sum(self.counts)
        rng = np.random.default_rng(seed)
        bounds = [
            math.inf if c == 0 else t / c + self.exploration * math.sqrt(math.log(max(n, 1)) / c)
            for c, t in zip(self.counts, self.totals, strict=True)
        ]
        best = max(bounds)
        return int(rng.choice([i for i, b in enumerate(bounds) if b == best]))

    def factory(self) -> _TunerFactory:
        snapshot = ConcessionTuner(
            self.directory, self.spec, self.group_size, self.exploration, [*self.counts], [*self.totals]
        )
        return _TunerFactory(self.spec, snapshot.choose)  # today's choices do not move while today is played

    def score(self, job: Job, result: NegotiationResult) -> float | None:
        if result.outcome.end_reason is EndReason.ERROR:
            return None
        return result.outcome.seller_utility

    def learn(self, day: int, groups: Sequence[LearningGroup]) -> LearnReport:
        played = [p for g in groups for p in g.episodes if p.reward is not None and isinstance(p.seller_record, int)]
        for p in played:
            self.counts[p.seller_record] += 1
            self.totals[p.seller_record] += float(p.reward)
        self.day = day
        self.version += 1 if played else 0
        self._save()
        best = max(range(len(ARMS)), key=lambda i: self.totals[i] / self.counts[i] if self.counts[i] else -1.0)
        return LearnReport(self.version, int(bool(played)), 0, {"best_e": ARMS[best], "episodes": len(played)})

    def resume(self) -> int:
        path = self.directory / STATE
        if not path.exists():
            return 0
        state = json.loads(path.read_text())
        self.counts, self.totals = state["counts"], state["totals"]
        self.day, self.version = state["day"], state["version"]
        return self.day

    def close(self) -> None:
        pass

    def _save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{STATE}.tmp"
        state = {"counts": self.counts, "totals": self.totals, "day": self.day, "version": self.version}
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.directory / STATE)
