"""The marketplace: job order, determinism, concurrency caps, seeds, errors and events."""

from __future__ import annotations

import logging

import pytest
from nego.market.events import EndKind, EventBus, NegotiationEnded, NegotiationStarted, RunFinished, TurnPlayed
from nego.market.marketplace import Job, Marketplace, child_seeds, make_negotiation_id, run_jobs
from nego.market.types import EndReason
from nego.scenarios.scenario import Role

from ..conftest import make_widget_scenario
from .fakes import BrokenFactory, CountedFactory, Factory, Gauge, factories


def jobs_for(n: int, seller: str = "a", buyer: str = "b", start: int = 0) -> list[Job]:
    sc = make_widget_scenario()
    return [Job(sc, seller, buyer, seed=start + i) for i in range(n)]


def test_negotiation_ids_are_deterministic_and_content_based():
    sc = make_widget_scenario()
    assert Job(sc, "a", "b", 3).negotiation_id == make_negotiation_id(make_widget_scenario(), "a", "b", 3)
    ids = {
        Job(sc, "a", "b", 3).negotiation_id,
        Job(sc, "a", "c", 3).negotiation_id,
        Job(sc, "a", "b", 4).negotiation_id,
        Job(sc.with_opener(Role.BUYER), "a", "b", 3).negotiation_id,
        Job(make_widget_scenario(max_rounds=7), "a", "b", 3).negotiation_id,
    }
    assert len(ids) == 5
    assert Job(sc, "a", "b", 3, negotiation_id="mine").negotiation_id == "mine"


async def test_results_come_back_in_job_order_not_completion_order():
    class Slow(Factory):
        def __call__(self, role, seed):
            agent = super().__call__(role, seed)
            agent.delay = 0.02 if self.spec == "slow" else 0.0
            return agent

    sc = make_widget_scenario()
    jobs = [Job(sc, "slow" if i % 2 == 0 else "fast", "b", seed=i) for i in range(10)]
    specs = {"slow": Slow("slow"), "fast": Slow("fast"), "b": Factory("b")}
    finished: list[int] = []
    bus = EventBus()
    bus.subscribe(lambda e: finished.append(e.job.seed) if isinstance(e, NegotiationEnded) else None)
    results = await Marketplace(specs, bus=bus).run(jobs)
    assert [r.seed for r in results] == list(range(10))
    assert finished != list(range(10))  # they really did finish out of order


async def test_same_jobs_same_results_and_child_seeds():
    f1, f2 = factories("a", "b"), factories("a", "b")
    r1 = await Marketplace(f1, concurrency=3).run(jobs_for(20))
    r2 = await Marketplace(f2, concurrency=50).run(jobs_for(20))
    assert r1 == r2
    seller_seed, buyer_seed = child_seeds(5)
    assert (Role.SELLER, seller_seed) in f1["a"].built and (Role.BUYER, buyer_seed) in f1["b"].built
    assert seller_seed != buyer_seed and child_seeds(5) == (seller_seed, buyer_seed) != child_seeds(6)


async def test_global_and_per_kind_caps_are_respected():
    gauge = Gauge()
    specs = {
        "llm": CountedFactory("llm", "openai", gauge),
        "rule": CountedFactory("rule", "rule", gauge),
        "rule2": CountedFactory("rule2", "rule", gauge),
    }
    sc = make_widget_scenario()
    jobs = [Job(sc, "llm", "rule", i) for i in range(30)] + [Job(sc, "rule", "rule2", i) for i in range(30)]
    results = await Marketplace(specs, concurrency=10, per_kind={"openai": 3}).run(jobs)
    assert len(results) == 60
    assert gauge.peak["openai"] == 3  # reached and never exceeded
    # a rule-vs-rule negotiation takes one 'rule' slot; in-flight agents of kind rule <= global cap
    assert gauge.peak["rule"] <= 10


async def test_waiting_for_a_busy_kind_does_not_starve_other_kinds():
    gauge = Gauge()
    specs = {"llm": CountedFactory("llm", "openai", gauge), "rule": CountedFactory("rule", "rule", gauge)}
    sc = make_widget_scenario()
    jobs = [Job(sc, "llm", "llm", i) for i in range(20)] + [Job(sc, "rule", "rule", i) for i in range(20)]
    await Marketplace(specs, concurrency=8, per_kind={"openai": 1}).run(jobs)
    assert gauge.peak["openai"] == 1
    assert gauge.peak["rule"] >= 5  # rule jobs used the global slots the queued llm jobs did not take


async def test_agent_errors_are_error_outcomes_not_no_deals():
    specs = {"a": Factory("a"), "broken": BrokenFactory()}
    sc = make_widget_scenario()
    jobs = [Job(sc, "a", "broken", 1), Job(sc, "a", "a", 2)]

    class Unbuildable(Factory):
        def __call__(self, role, seed):
            raise RuntimeError("no such model")

    specs["x"] = Unbuildable("x")
    jobs.append(Job(sc, "x", "a", 3))
    ended: list[NegotiationEnded] = []
    bus = EventBus()
    bus.subscribe(lambda e: ended.append(e) if isinstance(e, NegotiationEnded) else None)
    results = await Marketplace(specs, bus=bus).run(jobs)
    assert next(r.outcome.end_reason for r in results) is EndReason.ERROR
    assert results[2].outcome.end_reason is EndReason.ERROR and "no such model" in results[2].outcome.error
    kinds = {e.job.seed: e.kind for e in ended}
    assert kinds == {1: EndKind.ERROR, 2: EndKind.DEAL, 3: EndKind.ERROR}


async def test_unknown_spec_and_duplicate_ids_fail_before_playing():
    with pytest.raises(KeyError, match="no negotiator factory for spec 'zzz'"):
        await Marketplace(factories("a")).run(jobs_for(2, buyer="zzz"))
    with pytest.raises(ValueError, match="duplicate negotiation id"):
        await Marketplace(factories("a", "b")).run(jobs_for(2) + jobs_for(1))


async def test_resolver_callable_is_used_once_per_spec():
    asked: list[str] = []

    def resolve(spec: str) -> Factory:
        asked.append(spec)
        return Factory(spec)

    await Marketplace(resolve).run(jobs_for(5))
    assert sorted(asked) == ["a", "b"]


async def test_events_and_a_failing_subscriber_do_not_break_the_run(caplog):
    bus = EventBus()
    seen: list[object] = []

    def bad(event):
        raise RuntimeError("subscriber bug")

    bus.subscribe(bad)
    unsubscribe = bus.subscribe(seen.append)
    with caplog.at_level(logging.WARNING):
        results = await Marketplace(factories("a", "b"), bus=bus).run(jobs_for(3))
    assert len(results) == 3 and all(r.outcome.agreed for r in results)
    starts = [e for e in seen if isinstance(e, NegotiationStarted)]
    turns = [e for e in seen if isinstance(e, TurnPlayed)]
    assert len(starts) == 3 and isinstance(seen[-1], RunFinished) and seen[-1].ran == 3
    assert len(turns) == sum(len(r.turns) for r in results)
    last = next(e for e in turns if e.turn.action.kind.value == "accept")
    assert last.standing_seller is not None and last.standing_buyer is not None
    assert bus.errors == len(seen) and "subscriber bug" in caplog.text
    unsubscribe()
    unsubscribe()
    assert bus.active  # the failing subscriber is still there
    n = len(seen)
    await Marketplace(factories("a", "b"), bus=bus).run(jobs_for(1))
    assert len(seen) == n


def test_run_jobs_is_a_sync_wrapper():
    results = run_jobs(factories("a", "b"), jobs_for(4), concurrency=2)
    assert [r.seed for r in results] == [0, 1, 2, 3]


def test_bad_caps_are_rejected():
    with pytest.raises(ValueError, match="concurrency"):
        Marketplace(factories("a"), concurrency=0)
    with pytest.raises(ValueError, match="per_kind"):
        Marketplace(factories("a"), per_kind={"openai": 0})
