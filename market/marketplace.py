"""The marketplace: many negotiations on one asyncio loop, capped globally and per agent kind, with events
and resumable transcripts. It is the one engine that plays negotiations: simulations, evaluations, training
rollouts, behaviour-cloning data and replays all hand it :class:`Job` s.

A negotiator that keeps a record of its own episode (a learning seller's token trace, for instance) implements
:class:`Recorder`; :meth:`Marketplace.play` hands that record back beside the result, so a learner gets what it
needs without the market knowing what a token is.

With a :class:`~nego.market.workers.WorkerPool` the negotiations are played in worker processes; the marketplace
still writes every result and publishes every event itself, in this process, as the workers' results come back.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from nego.scenarios.pickling import compact_pickling
from nego.scenarios.scenario import Role, Scenario

from .collector import paced_collection
from .events import EventBus, NegotiationEnded, NegotiationStarted, RunFinished, TurnPlayed
from .protocol import Negotiator, ProtocolConfig, run_negotiation
from .types import ActionKind, EndReason, NegotiationResult, Outcome, Turn

if TYPE_CHECKING:
    from concurrent.futures import Future

    from .transcripts import TranscriptWriter
    from .workers import Chunk, Finished, WorkerPool


@runtime_checkable
class NegotiatorFactory(Protocol):
    """Builds one negotiator per negotiation of one spec: the marketplace, the spec registry and the agent server all
    take this. ``spec`` is canonical; ``kind`` names the backend family whose concurrency is capped together ("rule"
    for rule-based ones)."""

    spec: str
    kind: str

    def __call__(self, role: Role, seed: int) -> Negotiator: ...


FactorySource = Mapping[str, NegotiatorFactory] | Callable[[str], NegotiatorFactory]
"""Either a mapping from spec to factory or a resolver such as ``nego.agents.registry.resolve``."""


@runtime_checkable
class Recorder(Protocol):
    """A negotiator that keeps a record of its own episode. ``record`` is called once, after the negotiation ended,
    with its result; what it returns is handed back in :attr:`Played.seller_record` / :attr:`Played.buyer_record`."""

    async def act(self, obs: Any) -> Any: ...

    def record(self, result: NegotiationResult) -> Any: ...


Scorer = Callable[["Job", NegotiationResult], float | None]
"""A learner's reward for one played negotiation (None for negotiations it does not learn from); written to the
transcripts' ``reward`` column."""


def scenario_hash(scenario: Scenario) -> str:
    """``scenario.content_hash()`` (computed once per scenario object, which keeps it)."""
    return scenario.content_hash()


def make_negotiation_id(scenario: Scenario, seller: str, buyer: str, seed: int) -> str:
    """A stable id for (scenario content, seller spec, buyer spec, seed, opener): same inputs, same id."""
    key = "\x1f".join((scenario_hash(scenario), seller, buyer, str(seed), scenario.opener.value))
    return hashlib.sha256(key.encode()).hexdigest()[:20]


@compact_pickling
@dataclass(frozen=True, slots=True)
class Job:
    """One negotiation to play: a scenario, a seller spec, a buyer spec and a seed, plus where it belongs.

    ``negotiation_id`` is derived from the content when left empty; give one explicitly to play the very
    same (scenario, specs, seed) twice in a run. ``day`` and ``pair`` place it in a market day; ``step``,
    ``group`` and ``policy_version`` place it in a learner's training (the GRPO step whose batch it belongs to,
    its group in that batch, and how many updates the learning policy had received when it played).
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
    step: int | None = None
    group: int | None = None
    policy_version: int | None = None

    def __post_init__(self) -> None:
        if not self.negotiation_id:
            object.__setattr__(
                self, "negotiation_id", make_negotiation_id(self.scenario, self.seller, self.buyer, self.seed)
            )


@dataclass(frozen=True, slots=True)
class Draft:
    """A :class:`Job` whose scenario is still to be made: draw ``draw`` of a generating source (see
    :meth:`Marketplace.play_drafts`), and the rest of the job."""

    draw: int
    seller: str
    buyer: str
    seed: int
    run_id: str = ""
    day: int | None = None
    pair: int | None = None

    def job(self, scenario: Scenario) -> Job:
        """The job this draft becomes with its scenario (the same job, and id, as one made directly)."""
        return Job(scenario, self.seller, self.buyer, self.seed, run_id=self.run_id, day=self.day, pair=self.pair)


def child_seeds(seed: int) -> tuple[int, int]:
    """Independent seeds for the seller and the buyer of a negotiation seeded with ``seed``."""
    seller, buyer = np.random.SeedSequence(seed).spawn(2)
    return int(seller.generate_state(1, np.uint32)[0]), int(buyer.generate_state(1, np.uint32)[0])


@dataclass(frozen=True, slots=True)
class Played:
    """A job and how it went: its result, the attempt number it was written as, the records of sides that keep one
    (see :class:`Recorder`), the learner's reward if a scorer gave one, whether it was played now (``fresh``) or
    read back from the transcripts of an earlier run (then it has no records), and how long it took to play."""

    job: Job
    result: NegotiationResult
    attempt: int = 0
    seller_record: Any = None
    buyer_record: Any = None
    reward: float | None = None
    fresh: bool = True
    wall_s: float = 0.0


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
    jobs whose latest attempt ended in error are played again as the next attempt. With a ``pool``, the jobs are
    played by its worker processes (which build their own negotiators; see :mod:`.workers`), each under its share
    of the caps; sides that keep a record (:class:`Recorder`) and models loaded in this process cannot be played
    there.
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
        scorer: Scorer | None = None,
        pool: WorkerPool | None = None,
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
        self.scorer = scorer
        self.pool = pool

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

    def forget(self, spec: str) -> None:
        """Drop the cached factory of ``spec``: the next job resolves it again (a learner's new policy version)."""
        self._resolved.pop(spec, None)

    async def aclose(self) -> None:
        """Close what the factories used so far hold (HTTP sessions, model batchers); call on the loop they ran on."""
        for factory in self._resolved.values():
            aclose = getattr(factory, "aclose", None)
            if aclose is not None:
                await aclose()

    async def run(self, jobs: Sequence[Job]) -> list[NegotiationResult]:
        """Play every job (or take its completed result from the transcripts) and return results in job order."""
        return [p.result for p in await self.play(jobs)]

    async def play(self, jobs: Sequence[Job]) -> list[Played]:
        """Like :meth:`run`, but returns :class:`Played` records: results with the sides' own records and rewards."""
        ids = [j.negotiation_id for j in jobs]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"duplicate negotiation id {dup!r}: give jobs with equal content distinct ids")
        factories = [self.factory(spec) for spec in {s for j in jobs for s in (j.seller, j.buyer)}]
        if self.pool is not None:  # fail before playing anything if a spec cannot be played in a worker
            from .workers import check_workers_can_play

            check_workers_can_play(factories)
        writer = self.writer
        counts = _Counts()
        # the writer's index answers per job, so a run costs O(jobs) however much the directory already holds
        attempts = [self._attempt(j, writer, counts) for j in jobs] if writer is not None else [0] * len(jobs)
        try:
            with paced_collection():
                if self.pool is None:
                    played = await self._play_here(jobs, attempts, counts)
                else:
                    played = await self._play_in_workers(self.pool, jobs, attempts, counts)
        finally:
            if self.writer is not None:
                self.writer.flush()
        return self._wrap_up(jobs, played, counts)

    async def play_drafts(self, source: Callable[[int], Scenario] | None, drafts: Sequence[Draft]) -> list[Played]:
        """:meth:`play` of the jobs ``drafts`` become with their scenarios, ``source(draft.draw)`` (None: the scenario
        generator), each checked to be tradeable. With a worker pool each scenario is made by the worker that plays
        it and comes to this process once, with the result (made here and sent, it would cross three times); the
        jobs, their ids, attempts, transcripts and events are those :meth:`play` gives."""
        from .workers import check_workers_can_play, picklable, run_map, tradeable_scenario

        make = partial(tradeable_scenario, source)
        if self.pool is None or not picklable(make):
            scenarios = run_map(make, [d.draw for d in drafts], self.pool)
            return await self.play([d.job(sc) for d, sc in zip(drafts, scenarios, strict=True)])
        factories = [self.factory(spec) for spec in {s for d in drafts for s in (d.seller, d.buyer)}]
        check_workers_can_play(factories)
        counts = _Counts()
        jobs: list[Job | None] = [None] * len(drafts)
        played: list[Played | None] = [None] * len(drafts)
        waiting = any(f.kind != "rule" for f in factories)
        try:
            with paced_collection():
                sent = self.pool.play_drafts(
                    source, drafts, self.protocol, self.concurrency, self.per_kind, waiting=waiting
                )
                await self._take_drafted(sent, drafts, jobs, played, counts)
        finally:
            if self.writer is not None:
                self.writer.flush()
        return self._wrap_up(jobs, played, counts)  # type: ignore[arg-type]

    async def _take_drafted(
        self,
        sent: Sequence[tuple[Chunk, Future[bytes]]],
        drafts: Sequence[Draft],
        jobs: list[Job | None],
        played: list[Played | None],
        counts: _Counts,
    ) -> None:
        """Fill ``jobs`` and ``played`` as the drafted chunks ``sent`` come back: each job made from its scenario, then
        numbered, written and published as :meth:`play` would (a job complete in the transcripts already is left to
        be read back)."""
        from .workers import drafted

        writer, ids = self.writer, set()
        async with aclosing(_arrivals(sent, drafted)) as arrivals:
            async for k, (scenario, one) in arrivals:
                job = jobs[k] = drafts[k].job(scenario)
                if job.negotiation_id in ids:
                    raise ValueError(f"duplicate negotiation id {job.negotiation_id!r}: two drafts made one job")
                ids.add(job.negotiation_id)
                attempt = self._attempt(job, writer, counts) if writer is not None else 0
                if attempt is not None:
                    played[k] = self._finish(job, attempt, one, counts)

    def _wrap_up(self, jobs: Sequence[Job], played: list[Played | None], counts: _Counts) -> list[Played]:
        """The jobs' records in job order, those skipped as complete read back; the run's end published."""
        if counts.skipped and self.writer is not None:
            played = self._read_back(jobs, played, self.writer)  # type: ignore[assignment]
        if self.bus is not None and self.bus.active:
            wall = time.perf_counter() - counts.started
            self.bus.publish(RunFinished(len(jobs), counts.ran, counts.skipped, counts.errors, wall))
        return played  # type: ignore[return-value]

    @staticmethod
    def _attempt(job: Job, writer: TranscriptWriter, counts: _Counts) -> int | None:
        """The attempt number ``job`` is to be played as; None (and counted as skipped) if it is complete."""
        before = writer.latest(job.negotiation_id)
        if before is not None and before.ok:
            counts.skipped += 1
            return None
        return 0 if before is None else before.number + 1

    async def _play_here(
        self, jobs: Sequence[Job], attempts: Sequence[int | None], counts: _Counts
    ) -> list[Played | None]:
        global_slots = asyncio.Semaphore(self.concurrency)
        kind_slots = {k: asyncio.Semaphore(n) for k, n in self.per_kind.items()}

        async def one(job: Job, attempt: int | None) -> Played | None:
            if attempt is None:
                return None
            return await self._play(job, attempt, global_slots, kind_slots, counts)

        return list(await asyncio.gather(*(one(j, a) for j, a in zip(jobs, attempts, strict=True))))

    async def _play_in_workers(
        self, pool: WorkerPool, jobs: Sequence[Job], attempts: Sequence[int | None], counts: _Counts
    ) -> list[Played | None]:
        """Play the jobs to play on ``pool``; each chunk's results are written and published as it comes back (chunks
        done at once in job order), and returned in job order whatever the workers' scheduling."""
        from .workers import finished

        todo = [i for i, a in enumerate(attempts) if a is not None]
        played: list[Played | None] = [None] * len(jobs)
        waiting = any(
            self.factory(s).kind != "rule" for s in {s for i in todo for s in (jobs[i].seller, jobs[i].buyer)}
        )
        sent = pool.play([jobs[i] for i in todo], self.protocol, self.concurrency, self.per_kind, waiting=waiting)
        async with aclosing(_arrivals(sent, finished)) as arrivals:
            async for k, one in arrivals:
                i = todo[k]
                played[i] = self._finish(jobs[i], attempts[i], one, counts)  # type: ignore[arg-type]
        return played

    def _finish(self, job: Job, attempt: int, finished: Finished, counts: _Counts) -> Played:
        """A negotiation a worker played, counted, written and published here as if it had been played here."""
        result = finished.result
        counts.ran += 1
        counts.errors += result.outcome.end_reason is EndReason.ERROR
        played = self._scored(Played(job, result, attempt, wall_s=finished.wall_s))
        watched = self.bus is not None and self.bus.active
        if watched:
            self.bus.publish(NegotiationStarted(job, attempt))
            on_turn = _turn_publisher(self.bus, job.negotiation_id)
            for turn in result.turns:
                on_turn(turn)
        if self.writer is not None:
            self.writer.add(job, attempt, result, finished.wall_s, reward=played.reward)
        if watched:
            self.bus.publish(NegotiationEnded(job, attempt, result, finished.wall_s))
        return played

    def _read_back(
        self, jobs: Sequence[Job], played: Sequence[Played | None], writer: TranscriptWriter
    ) -> list[Played]:
        """Fill in the jobs skipped as complete with their results read back from the transcripts (no records)."""
        pending = [j.negotiation_id for j, p in zip(jobs, played, strict=True) if p is None]
        stored = writer.load_results(pending)
        out = []
        for job, p in zip(jobs, played, strict=True):
            if p is None:
                result = stored[job.negotiation_id]
                reward = self.scorer(job, result) if self.scorer is not None else None
                attempt = writer.latest(job.negotiation_id).number  # type: ignore[union-attr]
                p = Played(job, result, attempt, reward=reward, fresh=False)
            out.append(p)
        return out

    async def _play(
        self,
        job: Job,
        attempt: int,
        global_slots: asyncio.Semaphore,
        kind_slots: Mapping[str, asyncio.Semaphore],
        counts: _Counts,
    ) -> Played:
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
            played = await self._negotiate(job, attempt, seller_f, buyer_f, watched)
            wall = time.perf_counter() - start
        played = replace(played, wall_s=wall)
        result = played.result
        counts.ran += 1
        counts.errors += result.outcome.end_reason is EndReason.ERROR
        if self.writer is not None:
            self.writer.add(job, attempt, result, wall, reward=played.reward)
        if self.bus is not None and self.bus.active:
            self.bus.publish(NegotiationEnded(job, attempt, result, wall))
        return played

    async def _negotiate(
        self, job: Job, attempt: int, seller_f: NegotiatorFactory, buyer_f: NegotiatorFactory, watched: bool
    ) -> Played:
        seller_seed, buyer_seed = child_seeds(job.seed)
        try:
            seller = seller_f(Role.SELLER, seller_seed)
            buyer = buyer_f(Role.BUYER, buyer_seed)
        except Exception as e:  # a broken agent configuration fails its negotiations, not the market
            message = f"could not build agents: {type(e).__name__}: {e}"
            return self._scored(Played(job, error_result(job, message), attempt))
        on_turn = _turn_publisher(self.bus, job.negotiation_id) if watched else None
        result = await run_negotiation(
            job.scenario, seller, buyer, seed=job.seed, config=self.protocol, on_turn=on_turn
        )
        records = [_record_of(n, result) for n in (seller, buyer)]
        return self._scored(Played(job, result, attempt, records[0], records[1]))

    def _scored(self, played: Played) -> Played:
        if self.scorer is None:
            return played
        return replace(played, reward=self.scorer(played.job, played.result))


async def _arrivals(
    sent: Sequence[tuple[Chunk, Future[bytes]]], decode: Callable[[bytes], list[Any]]
) -> AsyncIterator[tuple[int, Any]]:
    """(index in the batch, what the worker sent for it, decoded) for every item of the chunks ``sent``, as the chunks
    come back (those done at once in batch order). A chunk that failed raises here; closed early (use
    ``contextlib.aclosing``), the chunks not started by then never will be."""
    pending = {asyncio.wrap_future(future): chunk for chunk, future in sent}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: pending[f].start):
                chunk = pending.pop(future)
                for k, item in enumerate(decode(future.result()), start=chunk.start):
                    yield k, item
    finally:
        for future in pending:
            future.cancel()


def _record_of(negotiator: Negotiator, result: NegotiationResult) -> Any:
    """What a :class:`Recorder` keeps of its episode, else None (the protocol's own ``isinstance`` check walks its
    members in Python on every call: this runs twice per negotiation)."""
    record = getattr(negotiator, "record", None)
    return record(result) if callable(record) else None


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
