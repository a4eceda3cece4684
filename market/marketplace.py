"""The marketplace: many negotiations on one asyncio loop, capped globally and per agent kind, with events
and resumable transcripts."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

import numpy as np
from nego.scenarios.scenario import Role, Scenario

from .events import EventBus, NegotiationEnded, NegotiationStarted, RunFinished, TurnPlayed
from .protocol import Negotiator, ProtocolConfig, run_negotiation
from .types import ActionKind, EndReason, NegotiationResult, Outcome, Turn

if TYPE_CHECKING:
    from .transcripts import TranscriptWriter


class NegotiatorFactory(Protocol):
    """Builds negotiators of one spec. ``kind`` names the backend family whose concurrency is capped together."""

    spec: str
    kind: str

    def __call__(self, role: Role, seed: int) -> Negotiator: ...


FactorySource = Mapping[str, NegotiatorFactory] | Callable[[str], NegotiatorFactory]
"""Either a mapping from spec to factory or a resolver such as ``nego.agents.registry.resolve``."""


@lru_cache(maxsize=4096)
def scenario_hash(scenario: Scenario) -> str:
    """``scenario.content_hash()``, cached: a run asks for it once per job and once per transcript row."""
    return scenario.content_hash()


def make_negotiation_id(scenario: Scenario, seller: str, buyer: str, seed: int) -> str:
    """A stable id for (scenario content, seller spec, buyer spec, seed, opener): same inputs, same id."""
    key = "\x1f".join((scenario_hash(scenario), seller, buyer, str(seed), scenario.opener.value))
    return hashlib.sha256(key.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class Job:
    """One negotiation to play: a scenario, a seller spec, a buyer spec and a seed, plus where it belongs.

    ``negotiation_id`` is derived from the content when left empty; give one explicitly to play the very
    same (scenario, specs, seed) twice in a run.
    """

    scenario: Scenario
    seller: str
    buyer: str
    seed: int
    negotiation_id: str = ""
    run_id: str = ""
    arm: str = ""
    day: int | None = None
    pair: int | None = None

    def __post_init__(self) -> None:
        if not self.negotiation_id:
            object.__setattr__(
                self, "negotiation_id", make_negotiation_id(self.scenario, self.seller, self.buyer, self.seed)
            )


def child_seeds(seed: int) -> tuple[int, int]:
    """Independent seeds for the seller and the buyer of a negotiation seeded with ``seed``."""
    seller, buyer = np.random.SeedSequence(seed).spawn(2)
    return int(seller.generate_state(1, np.uint32)[0]), int(buyer.generate_state(1, np.uint32)[0])


def error_result(job: Job, message: str) -> NegotiationResult:
    """The result of a negotiation that could not even start (its agents could not be built)."""
    sc = job.scenario
    outcome = Outcome(EndReason.ERROR, None, sc.seller.reservation, sc.buyer.reservation, 0, 0, error=message)
    return NegotiationResult(sc.id, job.seed, outcome, ())


@dataclass
class _Counts:
    ran: int = 0
    errors: int = 0
    skipped: int = 0
    started: float = field(default_factory=time.perf_counter)


class Marketplace:
    """Plays jobs concurrently on the running event loop and returns their results in job order.

    ``concurrency`` caps negotiations in flight; ``per_kind`` caps those involving a kind of agent (a
    negotiation between two agents of the same kind takes one slot of that kind). With a ``writer``, every
    result is written to transcripts, jobs already completed there are skipped (their results read back), and
    jobs whose latest attempt ended in error are played again as the next attempt.
    """

    def __init__(
        self,
        factories: FactorySource,
        *,
        concurrency: int = 256,
        per_kind: Mapping[str, int] | None = None,
        protocol: ProtocolConfig | None = None,
        bus: EventBus | None = None,
        writer: TranscriptWriter | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        bad = {k: v for k, v in (per_kind or {}).items() if v < 1}
        if bad:
            raise ValueError(f"per_kind caps must be >= 1, got {bad}")
        self._factories = factories
        self._resolved: dict[str, NegotiatorFactory] = {}
        self.concurrency = concurrency
        self.per_kind = dict(per_kind or {})
        self.protocol = protocol or ProtocolConfig()
        self.bus = bus
        self.writer = writer

    def factory(self, spec: str) -> NegotiatorFactory:
        """The factory for ``spec`` (resolved once and cached); a clear error for an unknown spec."""
        if spec not in self._resolved:
            if callable(self._factories) and not isinstance(self._factories, Mapping):
                self._resolved[spec] = self._factories(spec)
            elif spec in self._factories:
                self._resolved[spec] = self._factories[spec]
            else:
                known = ", ".join(sorted(self._factories)) or "none"
                raise KeyError(f"no negotiator factory for spec {spec!r}; known specs: {known}")
        return self._resolved[spec]

    async def aclose(self) -> None:
        """Close what the factories used so far hold (HTTP sessions, model batchers); call on the loop they ran on."""
        for factory in self._resolved.values():
            aclose = getattr(factory, "aclose", None)
            if aclose is not None:
                await aclose()

    async def run(self, jobs: Sequence[Job]) -> list[NegotiationResult]:
        """Play every job (or take its completed result from the transcripts) and return results in job order."""
        ids = [j.negotiation_id for j in jobs]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"duplicate negotiation id {dup!r}: give jobs with equal content distinct ids")
        for spec in {s for j in jobs for s in (j.seller, j.buyer)}:
            self.factory(spec)  # fail before playing anything if a spec is unknown
        writer = self.writer
        # the writer's index answers per job, so a run costs O(jobs) however much the directory already holds
        previous = {j.negotiation_id: writer.latest(j.negotiation_id) for j in jobs} if writer is not None else {}
        counts = _Counts()
        global_slots = asyncio.Semaphore(self.concurrency)
        kind_slots = {k: asyncio.Semaphore(n) for k, n in self.per_kind.items()}

        async def one(job: Job) -> NegotiationResult | None:
            before = previous.get(job.negotiation_id)
            if before is not None and before.ok:
                counts.skipped += 1
                return None
            attempt = 0 if before is None else before.number + 1
            return await self._play(job, attempt, global_slots, kind_slots, counts)

        try:
            results = await asyncio.gather(*(one(j) for j in jobs))
        finally:
            if self.writer is not None:
                self.writer.flush()
        if counts.skipped and writer is not None:
            pending = [j.negotiation_id for j, r in zip(jobs, results, strict=True) if r is None]
            stored = writer.load_results(pending)
            results = [stored[j.negotiation_id] if r is None else r for j, r in zip(jobs, results, strict=True)]
        if self.bus is not None and self.bus.active:
            wall = time.perf_counter() - counts.started
            self.bus.publish(RunFinished(len(jobs), counts.ran, counts.skipped, counts.errors, wall))
        return results

    async def _play(
        self,
        job: Job,
        attempt: int,
        global_slots: asyncio.Semaphore,
        kind_slots: Mapping[str, asyncio.Semaphore],
        counts: _Counts,
    ) -> NegotiationResult:
        seller_f, buyer_f = self.factory(job.seller), self.factory(job.buyer)
        async with AsyncExitStack() as stack:
            # kinds before the global slot, in sorted order: a job waiting for a busy kind holds no global slot,
            # and one lock order for everyone rules out deadlock
            for kind in sorted({seller_f.kind, buyer_f.kind}):
                if kind in kind_slots:
                    await stack.enter_async_context(kind_slots[kind])
            await stack.enter_async_context(global_slots)
            watched = self.bus is not None and self.bus.active
            if watched:
                self.bus.publish(NegotiationStarted(job, attempt))
            start = time.perf_counter()
            result = await self._negotiate(job, seller_f, buyer_f, watched)
            wall = time.perf_counter() - start
        counts.ran += 1
        counts.errors += result.outcome.end_reason is EndReason.ERROR
        if self.writer is not None:
            self.writer.add(job, attempt, result, wall)
        if self.bus is not None and self.bus.active:
            self.bus.publish(NegotiationEnded(job, attempt, result, wall))
        return result

    async def _negotiate(
        self, job: Job, seller_f: NegotiatorFactory, buyer_f: NegotiatorFactory, watched: bool
    ) -> NegotiationResult:
        seller_seed, buyer_seed = child_seeds(job.seed)
        try:
            seller = seller_f(Role.SELLER, seller_seed)
            buyer = buyer_f(Role.BUYER, buyer_seed)
        except Exception as e:  # a broken agent configuration fails its negotiations, not the market
            return error_result(job, f"could not build agents: {type(e).__name__}: {e}")
        on_turn = _turn_publisher(self.bus, job.negotiation_id) if watched else None
        return await run_negotiation(job.scenario, seller, buyer, seed=job.seed, config=self.protocol, on_turn=on_turn)


def _turn_publisher(bus: EventBus, negotiation_id: str) -> Callable[[Turn], None]:
    standing: list[float | None] = [None, None]

    def on_turn(turn: Turn) -> None:
        if turn.valid and turn.action.kind is ActionKind.OFFER:
            standing[:] = [turn.utility_seller, turn.utility_buyer]
        bus.publish(TurnPlayed(negotiation_id, turn, standing[0], standing[1]))

    return on_turn


def run_jobs(factories: FactorySource, jobs: Sequence[Job], **options: object) -> list[NegotiationResult]:
    """Synchronous entry point for scripts: ``Marketplace(factories, **options).run(jobs)`` on a fresh loop."""
    return asyncio.run(Marketplace(factories, **options).run(jobs))  # type: ignore[arg-type]
