"""The population layer: sellers and buyers with inventories, budgets and demand, trading over market days.

Each :meth:`MarketModel.step` is one day: match pairs, give each pair a scenario, play all the day's
negotiations concurrently through a :class:`Marketplace` on the model's own event loop, then settle the deals
in pair order. Same seed, same days, same transcripts. Sellers may be :mod:`learners <nego.market.learning>`, which
play each of their pairs as a group and learn from it after the day.

Deals are settled by the rule of :mod:`.settlement`; the days' statistics are the typed rows of :mod:`.day_stats`;
a rerun replays the days already on disk as :mod:`.replay` describes. With a :class:`~nego.market.workers.WorkerPool`
the day's negotiations are played, and its generated scenarios made, by worker processes; matching, planning and
settlement stay here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import mesa
import numpy as np
import polars as pl
from nego.scenarios.scenario import Scenario

from .collector import paced_collection
from .day_stats import (
    DAY_SCHEMA,
    SELLER_DAY_SCHEMA,
    DayRow,
    SellerDayRow,
    agents_frame,
    day_row,
    frame,
    seller_day_rows,
)
from .events import DayEnded, DayStarted, EventBus, LearnerUpdated
from .learning import ROLLOUT_ARM, Learner, LearningGroup, LearnReport
from .marketplace import Draft, FactorySource, Job, Marketplace, NegotiatorFactory, Played
from .protocol import ProtocolConfig
from .replay import StoredSlots, resume_learners
from .settlement import Settlement, check_tradeable, settle
from .traders import BuyerAgent, BuyerSetup, SellerAgent, SellerSetup
from .types import EndReason, NegotiationResult, Outcome
from .workers import run_map, tradeable_scenario

if TYPE_CHECKING:
    from .transcripts import TranscriptWriter
    from .workers import WorkerPool

T = TypeVar("T")

ScenarioSource = Sequence[Scenario] | Callable[[int], Scenario]
"""A list to draw scenarios from, or a function from a seed to a scenario (e.g. the scenario generator)."""


class MarketModel(mesa.Model):
    """Sellers and buyers trading over market days; ``step()`` plays one day. Use as a context manager (or call
    :meth:`close`) so its event loop is closed. A ``pool`` (kept by the caller for the model's life) plays the
    negotiations in worker processes; learners cannot learn there."""

    def __init__(
        self,
        factories: FactorySource,
        sellers: Sequence[SellerSetup],
        buyers: Sequence[BuyerSetup],
        *,
        scenarios: ScenarioSource | None = None,
        days: int = 5,
        seed: int = 0,
        run_id: str = "",
        concurrency: int = 256,
        per_kind: Mapping[str, int] | None = None,
        protocol: ProtocolConfig | None = None,
        bus: EventBus | None = None,
        writer: TranscriptWriter | None = None,
        learners: Sequence[Learner] = (),
        pool: WorkerPool | None = None,
    ) -> None:
        super().__init__(seed=seed)
        if days < 1:
            raise ValueError(f"days must be >= 1, got {days}")
        if scenarios is not None and not callable(scenarios) and not scenarios:
            raise ValueError("scenarios is an empty list: give at least one scenario, or None for generated ones")
        if scenarios is not None and not callable(scenarios):
            for scenario in scenarios:
                check_tradeable(scenario)
        self.seed = seed
        self.days = days
        self.run_id = run_id or f"market-{seed}"
        self.bus = bus
        self._scenarios = scenarios
        self.learners = {learner.spec: learner for learner in learners}
        if len(self.learners) != len(learners):
            raise ValueError("two learners trade under the same spec")
        bad = [lr.spec for lr in learners if lr.group_size < 1]
        if bad:
            raise ValueError(f"learner(s) {', '.join(bad)}: group_size must be >= 1")
        if self.learners and pool is not None:
            raise ValueError("learners learn from their episodes in this process: play them without worker processes")
        self._base_factories = factories
        self.market = Marketplace(
            self._factory if self.learners else factories,
            concurrency=concurrency,
            per_kind=per_kind,
            protocol=protocol,
            bus=bus,
            writer=writer,
            scorer=self._score if self.learners else None,
            pool=pool,
        )
        self.learned_through = resume_learners(self.learners.values(), writer)
        """The last day every learner has learned from (earlier days are replayed from transcripts on a rerun)."""
        self.seller_days: list[SellerDayRow] = []
        """One row per seller spec per played day."""
        self.learn_reports: list[tuple[int, str, LearnReport]] = []
        for setup in sellers:
            SellerAgent(self, setup)
        for setup in buyers:
            BuyerAgent(self, setup)
        self.day_stats: list[DayRow] = []
        """One row per played day."""
        self._runner: asyncio.Runner | None = None
        self._stored: StoredSlots | None = None
        self.running = self.can_match()

    def _factory(self, spec: str) -> NegotiatorFactory:
        learner = self.learners.get(spec)
        if learner is not None:
            return learner.factory()
        source = self._base_factories
        if callable(source) and not isinstance(source, Mapping):
            return source(spec)
        return source[spec]

    def _score(self, job: Job, result: NegotiationResult) -> float | None:
        learner = self.learners.get(job.seller)
        return learner.score(job, result) if learner is not None else None

    @property
    def stored(self) -> StoredSlots:
        """This run's negotiations complete on disk before it played anything (read once, on first use): what a
        rerun settles from its transcripts instead of playing."""
        if self._stored is None:
            self._stored = StoredSlots.read(self.market.writer, self.run_id)
        return self._stored

    @property
    def sellers(self) -> list[SellerAgent]:
        return list(self.agents_by_type[SellerAgent]) if SellerAgent in self.agents_by_type else []

    @property
    def buyers(self) -> list[BuyerAgent]:
        return list(self.agents_by_type[BuyerAgent]) if BuyerAgent in self.agents_by_type else []

    def can_match(self) -> bool:
        """True if at least one seller and one buyer can still trade."""
        return any(s.inventory > 0 for s in self.sellers) and any(b.demand > 0 and b.budget > 0 for b in self.buyers)

    def match(self) -> list[tuple[SellerAgent, BuyerAgent]]:
        """Today's pairs: sellers with inventory and buyers with demand and budget, shuffled by the model's rng,
        each in at most one pair."""
        sellers = [s for s in self.sellers if s.inventory > 0]
        buyers = [b for b in self.buyers if b.demand > 0 and b.budget > 0]
        self.random.shuffle(sellers)
        self.random.shuffle(buyers)
        return list(zip(sellers, buyers, strict=False))

    def _draw(self) -> int:
        """The model's next scenario draw: a generator seed, or an index into the scenario list."""
        source = self._scenarios
        return int(self.rng.integers(2**31 if source is None or callable(source) else len(source)))

    @property
    def _drafting(self) -> bool:
        """Whether the day's jobs go to the market as drafts: scenarios from the built-in generator and no learner (a
        learner's group is built from the job itself). A plugin's generating source keeps jobs: a rerun cannot tell
        from its transcripts which of its slots are complete, and a job is checked against them before it is played,
        where a draft is checked only once its scenario is made."""
        return self._scenarios is None and not self.learners

    def _scenarios_of(self, draws: Sequence[int]) -> Iterator[Scenario]:
        """The scenarios of ``draws``, in order: taken from the list, or generated (on the workers, when there are
        any, while the first ones are made into jobs)."""
        source = self._scenarios
        if source is not None and not callable(source):
            return (source[d] for d in draws)
        return run_map(partial(tradeable_scenario, source), draws, self.market.pool)

    def _plan(self, day: int, pairs: Sequence[tuple[SellerAgent, BuyerAgent]]) -> list[list[Job] | Outcome]:
        """Per pair, in pair order: the jobs to play (one, or a learner's group: the market's negotiation first, then
        its rollouts), or the outcome stored by an earlier run of the same slot. With the built-in generator and no
        learner, a job to play is still a :class:`Draft`: the market makes its scenario where it plays it."""
        plan: list[list[Job] | Outcome | None] = []
        slots = []  # the pairs to play: (pair, seller, buyer, seed, draw)
        for i, (s, b) in enumerate(pairs):
            seed = int(np.random.SeedSequence([self.seed, day, i]).generate_state(1, np.uint64)[0] >> 1)
            draw = self._draw()
            stored = self.stored.outcome(day, i, s.spec, b.spec, seed, draw, self._scenarios)
            plan.append(stored)
            if stored is None:
                slots.append((i, s, b, seed, draw))
        if self._drafting:
            for i, s, b, seed, draw in slots:
                plan[i] = [Draft(draw, s.spec, b.spec, seed, run_id=self.run_id, day=day, pair=i)]  # type: ignore[list-item]
            return plan  # type: ignore[return-value]
        # every draw is taken first and the scenarios made afterwards, in one batch: the same draws as one at a time
        scenarios = self._scenarios_of([draw for *_, draw in slots])
        for (i, s, b, seed, _), scenario in zip(slots, scenarios, strict=True):
            job = Job(scenario, s.spec, b.spec, seed, run_id=self.run_id, day=day, pair=i)
            learner = self.learners.get(s.spec)
            plan[i] = [job] if learner is None else self._group(job, learner, day, i)
        return plan  # type: ignore[return-value]

    def _group(self, job: Job, learner: Learner, day: int, pair: int) -> list[Job]:
        version = learner.policy_version
        group = [replace(job, group=pair, policy_version=version)]
        for k in range(1, learner.group_size):
            seed = int(np.random.SeedSequence([self.seed, day, pair, k]).generate_state(1, np.uint64)[0] >> 1)
            group.append(
                replace(job, seed=seed, negotiation_id="", arm=ROLLOUT_ARM, group=pair, policy_version=version)
            )
        return group

    def step(self) -> None:
        """Play one market day (Mesa has already advanced ``self.steps``, which is the day number)."""
        # the collector paced for the whole day, not only while the market plays: a day's planning and bookkeeping
        # make tens of thousands of objects that live until the day ends, and at CPython's pace the collector
        # traverses the day's results again and again meanwhile
        with paced_collection():
            self._day(self.steps)

    def _day(self, day: int) -> None:
        pairs = self.match()
        if not pairs:
            self.running = False
            return
        if self.bus is not None and self.bus.active:
            self.bus.publish(DayStarted(day, len(pairs)))
        if self._runner is None:
            self._runner = asyncio.Runner()  # one loop for the model's life: async clients keep their pools
        plan = self._plan(day, pairs)
        jobs = [j for p in plan if isinstance(p, list) for j in p]
        if not jobs:
            played = iter(())
        elif self._drafting:
            played = iter(self._runner.run(self.market.play_drafts(self._scenarios, jobs)))  # type: ignore[arg-type]
        else:
            played = iter(self._runner.run(self.market.play(jobs)))
        groups: list[list[Played] | None] = [[next(played) for _ in p] if isinstance(p, list) else None for p in plan]
        outcomes = [g[0].result.outcome if g is not None else p for g, p in zip(groups, plan, strict=True)]
        self._record(day, pairs, outcomes)  # type: ignore[arg-type]
        self.seller_days.extend(seller_day_rows(day, [g for g in groups if g is not None], self.learners))
        self._learn(day, pairs, groups)
        self.running = day < self.days and self.can_match()

    def _record(self, day: int, pairs: Sequence[tuple[SellerAgent, BuyerAgent]], outcomes: Sequence[Outcome]) -> None:
        settled = [_settle(s, b, o) for (s, b), o in zip(pairs, outcomes, strict=True)]  # pair order, never completion
        left = sum(s.inventory for s in self.sellers), sum(b.demand for b in self.buyers)
        row = day_row(day, outcomes, settled, *left)
        self.day_stats.append(row)
        if self.bus is not None and self.bus.active:
            self.bus.publish(DayEnded(day, row.pairs, row.deals, row.errors, row.units, row.revenue))

    def _learn(
        self, day: int, pairs: Sequence[tuple[SellerAgent, BuyerAgent]], groups: Sequence[list[Played] | None]
    ) -> None:
        if day <= self.learned_through:
            return  # a replayed day: the learners' restored state already holds what they learned from it
        for spec, learner in self.learners.items():
            mine = tuple(
                LearningGroup(day, i, tuple(g))
                for i, ((s, _), g) in enumerate(zip(pairs, groups, strict=True))
                if s.spec == spec and g is not None
            )
            report = learner.learn(day, mine)
            self.learn_reports.append((day, spec, report))
            self.market.forget(spec)  # the next day is played by the updated policy
            if self.bus is not None and self.bus.active:
                self.bus.publish(LearnerUpdated(day, spec, report))

    def seller_days_frame(self) -> pl.DataFrame:
        """Per seller spec and day: negotiations, deals, mean seller utility, invalid actions per seller turn."""
        return frame(self.seller_days, SELLER_DAY_SCHEMA)

    def run(self) -> pl.DataFrame:
        """Step until no pair can be matched or ``days`` days have passed; returns :meth:`days_frame`."""
        while self.running and self.steps < self.days:
            self.step()
        return self.days_frame()

    def days_frame(self) -> pl.DataFrame:
        """Per-day statistics: deals, settled units and revenue, mean utilities, what is left."""
        return frame(self.day_stats, DAY_SCHEMA)

    def agents_frame(self) -> pl.DataFrame:
        """Every agent's current state, one row each."""
        return agents_frame(self.sellers, self.buyers)

    def run_coroutine(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the model's own event loop (e.g. to close clients bound to it)."""
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner.run(coro)

    def close(self) -> None:
        for learner in self.learners.values():
            learner.close()
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    def __enter__(self) -> MarketModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _settle(seller: SellerAgent, buyer: BuyerAgent, o: Outcome) -> Settlement | None:
    """Settle the deal ``o`` ended in, if it ended in one (a failed negotiation settles nothing)."""
    if o.end_reason is EndReason.ERROR or not (o.agreed and o.agreement is not None):
        return None
    return settle(seller, buyer, o.agreement)
