"""Dev evaluation of a learning seller: every dev scenario against each named buyer, through the episode runner.

Negotiations are seeded by (seed, scenario index) only, so two models (or two steps of one run) meet identical
negotiations and can be paired. They are written to the run's transcripts as the ``dev`` arm with the training
step, like the rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from nego.agents.registry import resolve
from nego.market.marketplace import Job
from nego.market.rates import deal_rate, invalid_per_negotiation
from nego.scenarios.scenario import Scenario

from .runner import EpisodeRunner

DEV_ARM = "dev"


def _nan_if_none(rate: float | None) -> float:
    return float("nan") if rate is None else rate


@dataclass(frozen=True, slots=True)
class BuyerResult:
    """Per-negotiation results against one buyer, in scenario order (so two models can be paired). Every negotiation
    counts in the rates, one that ended in an error as a no-deal."""

    buyer: str
    utility: tuple[float, ...]
    agreed: tuple[bool, ...]
    invalid: tuple[int, ...]

    @property
    def mean_utility(self) -> float:
        return float(np.mean(self.utility))

    @property
    def deal_rate(self) -> float:
        """Deals per negotiation (NaN if none was played)."""
        return _nan_if_none(deal_rate(sum(self.agreed), len(self.agreed)))

    @property
    def invalid_per_episode(self) -> float:
        """Invalid seller moves per negotiation (an episode), not per move (NaN if none was played)."""
        return _nan_if_none(invalid_per_negotiation(sum(self.invalid), len(self.invalid)))

    def summary(self) -> dict[str, float]:
        """The JSON form the model registry keeps (``invalid_per_episode``: invalid moves per negotiation)."""
        return {
            "utility": round(self.mean_utility, 4),
            "deal_rate": round(self.deal_rate, 4),
            "invalid_per_episode": round(self.invalid_per_episode, 4),
            "n": len(self.utility),
        }


@dataclass(frozen=True, slots=True)
class DevEvaluation:
    """One dev evaluation: the step it was taken at and the results per buyer, in buyer order."""

    step: int
    buyers: tuple[BuyerResult, ...]

    def __getitem__(self, buyer: str) -> BuyerResult:
        for r in self.buyers:
            if r.buyer == buyer:
                return r
        raise KeyError(buyer)

    def summary(self) -> dict[str, dict[str, float]]:
        return {r.buyer: r.summary() for r in self.buyers}

    def line(self) -> str:
        """The evaluation on one line: utility / deal rate / invalid moves per negotiation, per buyer."""
        cells = [
            f"{r.buyer} {r.mean_utility:.3f} / {r.deal_rate:.2f} / {r.invalid_per_episode:.2f}" for r in self.buyers
        ]
        return "; ".join(cells) + " (utility / deal rate / invalid moves per negotiation)"


def dev_jobs(
    spec: str, scenarios: Sequence[Scenario], buyers: Sequence[str], *, seed: int = 0, step: int | None = None
) -> list[Job]:
    """Every scenario against every buyer; the seed of scenario ``i`` depends only on (seed, i)."""
    seeds = [int(x) for x in np.random.default_rng([seed, 99]).integers(2**31, size=len(scenarios))]
    tag = "base" if step is None else f"s{step:06d}"
    jobs = []
    for k, buyer in enumerate(buyers):
        canonical = resolve(buyer).spec
        for i, (sc, s) in enumerate(zip(scenarios, seeds, strict=True)):
            nid = f"{DEV_ARM}-{tag}-b{k}-{i:04d}"
            jobs.append(Job(sc, spec, canonical, s, nid, DEV_ARM, DEV_ARM, step=step, policy_version=step))
    return jobs


def evaluate(
    runner: EpisodeRunner,
    spec: str,
    scenarios: Sequence[Scenario],
    buyers: Sequence[str],
    *,
    seed: int = 0,
    step: int | None = None,
    concurrency: int = 0,
) -> DevEvaluation:
    """Play the learner ``spec`` (as ``runner`` knows it) on every scenario against each buyer spec, at most
    ``concurrency`` negotiations in flight (0: the runner's own cap). The cap bounds what an in-process model holds
    for the negotiations in flight (their conversations' states); each negotiation plays the same under any cap."""
    played = runner.play(dev_jobs(spec, scenarios, buyers, seed=seed, step=step), concurrency=concurrency)
    n = len(scenarios)
    out = []
    for k, buyer in enumerate(buyers):
        outcomes = [p.result.outcome for p in played[k * n : (k + 1) * n]]
        out.append(
            BuyerResult(
                buyer,
                tuple(o.seller_utility for o in outcomes),
                tuple(o.agreed for o in outcomes),
                tuple(o.invalid_seller for o in outcomes),
            )
        )
    return DevEvaluation(step or 0, tuple(out))
