"""The Mesa population model: days, matching, settlement, determinism, resume and events."""

from __future__ import annotations

import polars as pl
import pytest
from nego.market.events import DayEnded, DayStarted, EventBus
from nego.market.population import BuyerAgent, BuyerSetup, MarketModel, SellerAgent, SellerSetup
from nego.market.settlement import settle
from nego.market.transcript_rows import TIMING_COLUMNS
from nego.market.transcripts import TranscriptWriter, read_negotiations, read_turns
from nego.market.types import Offer
from nego.scenarios.scenario import Role

from ..conftest import make_widget_scenario
from .fakes import factories

SELLERS = [SellerSetup("a", inventory=12, unit_cost=40.0), SellerSetup("a2", inventory=5)]
BUYERS = [BuyerSetup("b", demand=9, budget=2_000.0), BuyerSetup("b", demand=4), BuyerSetup("b2", demand=30)]
SCENARIOS = [make_widget_scenario(), make_widget_scenario(max_rounds=4).with_opener(Role.BUYER)]


def model(seed: int, **options) -> MarketModel:
    options.setdefault("scenarios", SCENARIOS)
    return MarketModel(factories("a", "a2", "b", "b2"), SELLERS, BUYERS, seed=seed, **options)


def state(m: MarketModel) -> list[tuple]:
    return [(type(a).__name__, a.spec, getattr(a, "inventory", None), getattr(a, "demand", None)) for a in m.agents]


def test_days_move_goods_and_money_consistently():
    with model(3, days=4) as m:
        days = m.run()
        assert 1 <= days.height <= 4 and days["day"].to_list() == list(range(1, days.height + 1))
        sold = sum(s.sold for s in m.sellers)
        assert sold == days["units"].sum() == sum(b.bought for b in m.buyers) > 0
        assert sum(s.inventory for s in m.sellers) == 17 - sold == days["inventory_left"][-1]
        assert sum(s.revenue for s in m.sellers) == pytest.approx(sum(b.spent for b in m.buyers))
        assert days["revenue"].sum() == pytest.approx(sum(s.revenue for s in m.sellers))
        assert all(s.inventory >= 0 for s in m.sellers) and all(b.demand >= 0 for b in m.buyers)
        assert all(b.budget >= 0 for b in m.buyers)
        assert (days["pairs"] <= 2).all() and (days["deals"] + days["no_deals"] + days["errors"] == days["pairs"]).all()


def test_same_seed_same_days_and_transcripts(tmp_path):
    frames = []
    for name in ("one", "two"):
        with model(11, days=3, writer=TranscriptWriter(tmp_path / name, flush_every=3)) as m:
            frames.append((m.run(), state(m)))
    assert frames[0][0].equals(frames[1][0]) and frames[0][1] == frames[1][1]
    for read in (read_negotiations, read_turns):
        a, b = read(tmp_path / "one"), read(tmp_path / "two")
        drop = [c for c in TIMING_COLUMNS if c in a.columns]
        assert a.height > 0 and a.drop(drop).equals(b.drop(drop))
    neg = read_negotiations(tmp_path / "one")
    assert set(neg["day"]) == set(frames[0][0]["day"]) and neg["run_id"].unique().to_list() == ["market-11"]
    with model(12, days=3) as m:
        other = m.run()
    assert not other.equals(frames[0][0]) or state(m) != frames[0][1]


def test_rerun_with_the_same_writer_resumes_without_replaying(tmp_path):
    with model(5, days=3, writer=TranscriptWriter(tmp_path)) as m:
        first = m.run()
    writer = TranscriptWriter(tmp_path)
    with model(5, days=3, writer=writer) as m:
        again = m.run()
    assert writer.written == 0 and again.equals(first)
    assert read_negotiations(tmp_path).height == first["pairs"].sum()


def test_stops_when_nobody_can_trade_and_publishes_days():
    bus = EventBus()
    seen = []
    bus.subscribe(seen.append)
    sellers = [SellerSetup("a", inventory=1)]
    with MarketModel(
        factories("a", "b"), sellers, [BuyerSetup("b", demand=50)], scenarios=SCENARIOS[:1], days=10, seed=0, bus=bus
    ) as m:
        days = m.run()
    assert days.height == 1 and not m.running and m.sellers[0].inventory == 0
    assert [type(e) for e in seen if isinstance(e, DayStarted | DayEnded)] == [DayStarted, DayEnded]
    with pytest.raises(ValueError, match="empty list"):
        MarketModel(factories("a"), sellers, [], scenarios=[])


def test_scenario_source_may_be_a_function_of_a_seed():
    asked = []

    def source(seed: int):
        asked.append(seed)
        return SCENARIOS[seed % 2]

    with model(2, days=2, scenarios=source) as m:
        m.run()
    assert len(asked) == sum(m.days_frame()["pairs"]) and len(set(asked)) == len(asked)


def test_settlement_rule():
    m = MarketModel(
        factories("a", "b"), [SellerSetup("a", 5)], [BuyerSetup("b", 10, budget=300.0)], scenarios=SCENARIOS[:1]
    )
    seller, buyer = m.sellers[0], m.buyers[0]
    assert isinstance(seller, SellerAgent) and isinstance(buyer, BuyerAgent)
    done = settle(seller, buyer, Offer({"price": 100, "quantity": 8, "warranty": "1y"}))
    # 8 wanted, 5 in stock, budget 300 buys 3 at 100
    assert (done.units, done.paid, seller.inventory, buyer.demand, buyer.budget) == (3, 300.0, 2, 7, 0.0)
    plain = settle(seller, buyer, Offer({"warranty": "2y"}))
    assert (plain.units, plain.paid, seller.inventory) == (1, 0.0, 1)
    assert m.agents_frame().filter(pl.col("side") == "seller")["money"].to_list() == [300.0]


def test_generated_scenarios_by_default():
    with MarketModel(factories("a", "b"), [SellerSetup("a", 3)], [BuyerSetup("b", 3)], days=2, seed=4) as m:
        days = m.run()
    assert days["pairs"].sum() >= 1 and days["errors"].sum() == 0


def test_a_scenario_with_negative_quantities_is_refused_before_any_day():
    from dataclasses import replace

    from nego.scenarios.issues import Issue, IssueKind

    good = SCENARIOS[0]
    issues = tuple(
        Issue("quantity", IssueKind.INT, low=-5, high=10) if i.name == "quantity" else i for i in good.issues
    )
    bad = replace(good, id="returns", issues=issues)
    with pytest.raises(ValueError, match=r"'returns'.*'quantity' admits -5 < 0.*low >= 0"):
        MarketModel(factories("a", "b"), [SellerSetup("a", 5)], [BuyerSetup("b", 5)], scenarios=[good, bad])
    with pytest.raises(ValueError, match="'quantity' admits -5"), model(0, scenarios=lambda seed: bad) as m:
        m.run()


BIG = dict(
    sellers=[SellerSetup("a", inventory=10**6), SellerSetup("a2", inventory=10**6)],
    buyers=[BuyerSetup("b", demand=10**6), BuyerSetup("b2", demand=10**6), BuyerSetup("b", demand=10**6)],
)


def generated(seed: int, days: int, writer: TranscriptWriter, specs=None) -> MarketModel:
    """A market on generated scenarios whose two pairs trade every day."""
    return MarketModel(specs or factories("a", "a2", "b", "b2"), days=days, seed=seed, writer=writer, **BIG)


def test_a_resumed_finished_run_plays_nothing_and_reads_each_part_a_bounded_number_of_times(tmp_path, monkeypatch):
    from collections import Counter
    from pathlib import Path

    from nego.scenarios import generator

    with generated(8, 6, TranscriptWriter(tmp_path, flush_every=1)) as m:
        first = m.run()
    parts = sorted(p.name for p in (tmp_path / "negotiations").glob("part-*.parquet"))
    assert len(parts) == first["pairs"].sum() == 12  # one part per negotiation: many parts per day
    reads: Counter[str] = Counter()
    real_scan, real_generate = pl.scan_parquet, generator.generate_scenario

    def counting_scan(source, **kw):
        for path in [source] if isinstance(source, str | Path) else source:
            reads[f"{Path(path).parent.name}/{Path(path).name}"] += 1
        return real_scan(source, **kw)

    generated_now = []
    monkeypatch.setattr(pl, "scan_parquet", counting_scan)
    monkeypatch.setattr(
        generator, "generate_scenario", lambda seed, **kw: generated_now.append(seed) or real_generate(seed, **kw)
    )
    specs = factories("a", "a2", "b", "b2")
    writer = TranscriptWriter(tmp_path)
    with generated(8, 6, writer, specs) as m:
        again = m.run()
    assert again.equals(first) and writer.written == 0
    assert not any(f.built for f in specs.values())  # nothing was played
    assert len(generated_now) <= 1  # one scenario, to check the generator still makes what was played
    assert set(reads) == {f"negotiations/{p}" for p in parts}  # no turns part is read
    assert max(reads.values()) <= 2  # the writer's index, then the population's stored outcomes


def test_a_run_resumed_after_some_days_equals_one_that_ran_through(tmp_path):
    with generated(9, 2, TranscriptWriter(tmp_path / "resumed", flush_every=2)) as m:
        m.run()
    writer = TranscriptWriter(tmp_path / "resumed", flush_every=2)
    with generated(9, 4, writer) as m:
        resumed = m.run()
        resumed_state = state(m)
    assert writer.written == 4  # days 3 and 4 only
    with generated(9, 4, TranscriptWriter(tmp_path / "through", flush_every=2)) as m:
        through = m.run()
        assert state(m) == resumed_state
    assert resumed.equals(through)
    for read in (read_negotiations, read_turns):
        a, b = read(tmp_path / "resumed"), read(tmp_path / "through")
        drop = [c for c in TIMING_COLUMNS if c in a.columns]
        assert a.drop(drop).equals(b.drop(drop))


def test_stored_outcomes_are_not_reused_when_the_generator_makes_other_scenarios(tmp_path, monkeypatch, caplog):
    from nego.scenarios import generator

    with generated(3, 2, TranscriptWriter(tmp_path)) as m:
        first = m.run()
    real = generator.generate_scenario
    monkeypatch.setattr(generator, "generate_scenario", lambda seed, **kw: real(seed, max_rounds=5, **kw))
    writer = TranscriptWriter(tmp_path)
    with generated(3, 2, writer) as m:
        m.run()
    assert writer.written == first["pairs"].sum()  # every pair played again, on the scenarios made now
    assert "no longer makes the scenarios" in caplog.text
    assert (read_negotiations(tmp_path)["max_rounds"] == 5).sum() == writer.written


def test_day_statistics_are_typed_rows_turned_into_tables_at_the_edge():
    from dataclasses import FrozenInstanceError, asdict

    from nego.market.day_stats import DAY_SCHEMA, SELLER_DAY_SCHEMA, DayRow, SellerDayRow

    with model(3, days=3) as m:
        days = m.run()
    assert m.day_stats and all(isinstance(r, DayRow) for r in m.day_stats)
    assert m.seller_days and all(isinstance(r, SellerDayRow) for r in m.seller_days)
    with pytest.raises(FrozenInstanceError):
        m.day_stats[0].deals = 99  # type: ignore[misc]
    assert days.schema == DAY_SCHEMA and days.rows(named=True) == [asdict(r) for r in m.day_stats]
    per_seller = m.seller_days_frame()
    assert per_seller.schema == SELLER_DAY_SCHEMA
    played = per_seller.group_by("day").agg(pl.col("negotiations").sum()).sort("day")
    assert played["negotiations"].to_list() == days["pairs"].to_list()  # no learner: one negotiation per pair


def test_a_rerun_knows_how_many_of_its_negotiations_are_already_on_disk(tmp_path):
    with model(5, days=2, writer=TranscriptWriter(tmp_path)) as m:
        assert len(m.stored) == 0
        first = m.run()
    with model(5, days=3, writer=TranscriptWriter(tmp_path)) as m:
        assert len(m.stored) == first["pairs"].sum() == read_negotiations(tmp_path).height
    with model(5, days=3, writer=TranscriptWriter(tmp_path), run_id="another") as m:
        assert len(m.stored) == 0  # only this run's negotiations count
