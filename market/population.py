"""The population layer: sellers and buyers with inventories, budgets and demand, trading over market days.

Each :meth:`MarketModel.step` is one day: match pairs, give each pair a scenario, play all the day's
negotiations concurrently through a :class:`Marketplace` on the model's own event loop, then settle the deals
in pair order. Same seed, same days, same transcripts. Sellers may be :mod:`learners <nego.market.learning>`, which
play each of their pairs as a group and learn from it after the day.

Deals are settled by the rule of :mod:`.settlement`.

Resuming with a writer: the negotiations of this run already completed on disk are read once per run, and a
pair whose slot (day, pair, seller, buyer, seed and scenario) is among them is settled from its stored outcome
without building its job, so a finished run neither plays nor regenerates anything.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import mesa
import numpy as np
import polars as pl
from nego.scenarios.scenario import Scenario

from .events import DayEnded, DayStarted, EventBus, LearnerUpdated
from .learning import ROLLOUT_ARM, Learner, LearningGroup, LearnReport
from .marketplace import FactorySource, Job, Marketplace, NegotiatorFactory, Played
from .protocol import ProtocolConfig
from .rates import invalid_per_move_of
from .settlement import check_tradeable, settle
from .types import EndReason, NegotiationResult, Outcome

if TYPE_CHECKING:
    from .transcripts import TranscriptWriter

T = TypeVar("T")
logger = logging.getLogger(__name__)

ScenarioSource = Sequence[Scenario] | Callable[[int], Scenario]
"""A list to draw scenarios from, or a function from a seed to a scenario (e.g. the scenario generator)."""


@dataclass(frozen=True, slots=True)
class SellerSetup:
    """A seller at the start of a simulation."""

    spec: str
    inventory: int
    unit_cost: float = 0.0


@dataclass(frozen=True, slots=True)
class BuyerSetup:
    """A buyer at the start of a simulation; ``budget`` is spent on priced deals only."""

    spec: str
    demand: int
    budget: float = math.inf


class SellerAgent(mesa.Agent):
    """A seller: negotiates with its spec's agents while it has inventory."""

    def __init__(self, model: MarketModel, setup: SellerSetup) -> None:
        super().__init__(model)
        self.spec = setup.spec
        self.inventory = setup.inventory
        self.unit_cost = setup.unit_cost
        self.sold = 0
        self.revenue = 0.0

    @property
    def profit(self) -> float:
        return self.revenue - self.sold * self.unit_cost


class BuyerAgent(mesa.Agent):
    """A buyer: negotiates while it has demand and budget left."""

    def __init__(self, model: MarketModel, setup: BuyerSetup) -> None:
        super().__init__(model)
        self.spec = setup.spec
        self.demand = setup.demand
        self.budget = setup.budget
        self.bought = 0
        self.spent = 0.0


SELLER_DAY_SCHEMA = pl.Schema(
    {
        "day": pl.Int32,
        "seller": pl.String,
        "negotiations": pl.Int32,
        "deals": pl.Int32,
        "errors": pl.Int32,
        "mean_seller_utility": pl.Float64,
        "invalid_per_turn": pl.Float64,
        "learning": pl.Boolean,
        "policy_version": pl.Int32,
    }
)
"""One row per seller spec per day: how its negotiations went (a learner's rollouts included, its policy version is
the one that played)."""

DAY_SCHEMA = pl.Schema(
    {
        "day": pl.Int32,
        "pairs": pl.Int32,
        "deals": pl.Int32,
        "no_deals": pl.Int32,
        "errors": pl.Int32,
        "units": pl.Int64,
        "revenue": pl.Float64,
        "mean_seller_utility": pl.Float64,
        "mean_buyer_utility": pl.Float64,
        "inventory_left": pl.Int64,
        "demand_left": pl.Int64,
    }
)


class MarketModel(mesa.Model):
    """Sellers and buyers trading over market days; ``step()`` plays one day. Use as a context manager (or call
    :meth:`close`) so its event loop is closed."""

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
        self._base_factories = factories
        self.market = Marketplace(
            self._factory if self.learners else factories,
            concurrency=concurrency,
            per_kind=per_kind,
            protocol=protocol,
            bus=bus,
            writer=writer,
            scorer=self._score if self.learners else None,
        )
        self.learned_through = self._resume_learners(writer)
        """The last day every learner has learned from (earlier days are replayed from transcripts on a rerun)."""
        self.seller_days: list[dict[str, object]] = []
        """One row per seller spec per played day (see :data:`SELLER_DAY_SCHEMA`)."""
        self.learn_reports: list[tuple[int, str, LearnReport]] = []
        for setup in sellers:
            SellerAgent(self, setup)
        for setup in buyers:
            BuyerAgent(self, setup)
        self.day_stats: list[dict[str, float | int | None]] = []
        """One row per played day (see :data:`DAY_SCHEMA`)."""
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

    def _resume_learners(self, writer: TranscriptWriter | None) -> int:
        if not self.learners:
            return 0
        done = min(learner.resume() for learner in self.learners.values())
        if writer is not None:
            writer.rollback(pl.col("day") > done, f"of days after day {done}, the last day every learner learned from")
        return done

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

    def _scenario(self, draw: int) -> Scenario:
        source = self._scenarios
        if source is None:
            from nego.scenarios.generator import generate_scenario

            source = generate_scenario
        if callable(source):
            scenario = source(draw)
            check_tradeable(scenario)
            return scenario
        return source[draw]

    def _plan(self, day: int, pairs: Sequence[tuple[SellerAgent, BuyerAgent]]) -> list[list[Job] | Outcome]:
        """Per pair, in pair order: the jobs to play (one, or a learner's group: the market's negotiation first, then
        its rollouts), or the outcome stored by an earlier run of the same slot."""
        if self._stored is None:
            writer = self.market.writer
            self._stored = StoredSlots(writer.completed_rows(self.run_id) if writer is not None else None)
        plan: list[list[Job] | Outcome] = []
        for i, (s, b) in enumerate(pairs):
            seed = int(np.random.SeedSequence([self.seed, day, i]).generate_state(1, np.uint64)[0] >> 1)
            draw = self._draw()
            stored = self._stored.outcome(day, i, s.spec, b.spec, seed, draw, self._scenarios)
            if stored is not None:
                plan.append(stored)
                continue
            job = Job(self._scenario(draw), s.spec, b.spec, seed, run_id=self.run_id, day=day, pair=i)
            learner = self.learners.get(s.spec)
            plan.append([job] if learner is None else self._group(job, learner, day, i))
        return plan

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
        day = self.steps
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
        played = iter(self._runner.run(self.market.play(jobs)) if jobs else ())
        groups: list[list[Played] | None] = [[next(played) for _ in p] if isinstance(p, list) else None for p in plan]
        outcomes = [g[0].result.outcome if g is not None else p for g, p in zip(groups, plan, strict=True)]
        self._record(day, pairs, outcomes)  # type: ignore[arg-type]
        self._record_sellers(day, [g for g in groups if g is not None])
        self._learn(day, pairs, groups)
        self.running = day < self.days and self.can_match()

    def _record(self, day: int, pairs: Sequence[tuple[SellerAgent, BuyerAgent]], outcomes: Sequence[Outcome]) -> None:
        units, revenue, deals, errors = 0, 0.0, 0, 0
        utilities: list[tuple[float, float]] = []
        for (seller, buyer), o in zip(pairs, outcomes, strict=True):  # pair order, never completion order
            if o.end_reason is EndReason.ERROR:
                errors += 1
                continue
            utilities.append((o.seller_utility, o.buyer_utility))
            if o.agreed and o.agreement is not None:
                deals += 1
                done = settle(seller, buyer, o.agreement)
                units, revenue = units + done.units, revenue + done.paid
        mean = np.mean(utilities, axis=0) if utilities else (None, None)
        self.day_stats.append(
            {
                "day": day,
                "pairs": len(pairs),
                "deals": deals,
                "no_deals": len(pairs) - deals - errors,
                "errors": errors,
                "units": units,
                "revenue": revenue,
                "mean_seller_utility": None if mean[0] is None else float(mean[0]),
                "mean_buyer_utility": None if mean[1] is None else float(mean[1]),
                "inventory_left": sum(s.inventory for s in self.sellers),
                "demand_left": sum(b.demand for b in self.buyers),
            }
        )
        if self.bus is not None and self.bus.active:
            self.bus.publish(DayEnded(day, len(pairs), deals, errors, units, revenue))

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

    def _record_sellers(self, day: int, groups: Sequence[list[Played]]) -> None:
        by_spec: dict[str, list[Played]] = {}
        for g in groups:
            by_spec.setdefault(g[0].job.seller, []).extend(g)
        for spec, items in by_spec.items():
            ok = [p for p in items if p.result.outcome.end_reason is not EndReason.ERROR]
            learner = self.learners.get(spec)
            self.seller_days.append(
                {
                    "day": day,
                    "seller": spec,
                    "negotiations": len(items),
                    "deals": sum(p.result.outcome.agreed for p in ok),
                    "errors": len(items) - len(ok),
                    "mean_seller_utility": float(np.mean([p.result.outcome.seller_utility for p in ok]))
                    if ok
                    else None,
                    "invalid_per_turn": invalid_per_move_of(p.result for p in ok),
                    "learning": learner is not None,
                    "policy_version": items[0].job.policy_version if learner is not None else None,
                }
            )

    def seller_days_frame(self) -> pl.DataFrame:
        """Per seller spec and day: negotiations, deals, mean seller utility, invalid moves per seller move."""
        return pl.DataFrame(self.seller_days, schema=SELLER_DAY_SCHEMA, orient="row")

    def run(self) -> pl.DataFrame:
        """Step until no pair can be matched or ``days`` days have passed; returns :meth:`days_frame`."""
        while self.running and self.steps < self.days:
            self.step()
        return self.days_frame()

    def days_frame(self) -> pl.DataFrame:
        """Per-day statistics: deals, settled units and revenue, mean utilities, what is left."""
        return pl.DataFrame(self.day_stats, schema=DAY_SCHEMA, orient="row")

    def agents_frame(self) -> pl.DataFrame:
        """Every agent's current state, one row each."""
        rows = [
            {
                "id": s.unique_id,
                "side": "seller",
                "spec": s.spec,
                "stock": s.inventory,
                "units": s.sold,
                "money": s.revenue,
            }
            for s in self.sellers
        ] + [
            {"id": b.unique_id, "side": "buyer", "spec": b.spec, "stock": b.demand, "units": b.bought, "money": b.spent}
            for b in self.buyers
        ]
        schema = {
            "id": pl.Int64,
            "side": pl.String,
            "spec": pl.String,
            "stock": pl.Int64,
            "units": pl.Int64,
            "money": pl.Float64,
        }
        return pl.DataFrame(rows, schema=schema, orient="row")

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


class StoredSlots:
    """The completed negotiations of one run, by slot, as a resumed :class:`MarketModel` reads them (once).

    A stored negotiation stands for a pair only if everything that defines it matches: day, pair, seller and
    buyer specs, seed, and the scenario. A scenario from a list is compared by content hash. A generated scenario
    is matched by the recipe in its id (the draw is its generator seed), once the generator has been checked to
    still make, for one stored draw, the very scenario that was played; any other scenario source is played
    through the marketplace, which skips what is done by negotiation id.
    """

    def __init__(self, rows: pl.DataFrame | None) -> None:
        cols = ("day", "pair", "seller", "buyer", "seed")
        self._rows: dict[tuple, dict[str, Any]] = {}
        if rows is not None:
            self._rows = {tuple(r[c] for c in cols): r for r in rows.iter_rows(named=True)}
        self._generator_ok: bool | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def outcome(
        self, day: int, pair: int, seller: str, buyer: str, seed: int, draw: int, source: ScenarioSource | None
    ) -> Outcome | None:
        """The stored outcome of this slot, or None if it has to be played."""
        row = self._rows.get((day, pair, seller, buyer, seed))
        if row is None or not self._same_scenario(row, draw, source):
            return None
        from .transcript_rows import outcome_from_row

        return outcome_from_row(row)

    def _same_scenario(self, row: dict[str, Any], draw: int, source: ScenarioSource | None) -> bool:
        from .marketplace import scenario_hash

        if source is not None:
            return not callable(source) and scenario_hash(source[draw]) == row["scenario_hash"]
        from nego.scenarios.generator import GeneratedId, generate_scenario

        recipe = GeneratedId.parse(row["scenario_id"])
        if recipe is None or (recipe.seed, recipe.index, recipe.opposition, recipe.zopa) != (draw, 0, None, True):
            return False
        if self._generator_ok is None:
            self._generator_ok = scenario_hash(generate_scenario(draw)) == row["scenario_hash"]
            if not self._generator_ok:
                logger.warning(
                    "the scenario generator no longer makes the scenarios this run played (draw %d): stored "
                    "negotiations are not reused and every pair is played again",
                    draw,
                )
        return self._generator_ok
