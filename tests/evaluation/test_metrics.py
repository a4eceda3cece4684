"""Per-negotiation metrics and the best-response optimality gap, checked against exact values."""

from __future__ import annotations

import asyncio

import numpy as np
import polars as pl
import pytest
from nego.agents.registry import resolve
from nego.evaluation.best_response import _advance, best_response_value, optimality_gap
from nego.evaluation.metrics import ZoneFacts, compute_metrics, normalised_nash, pareto_distance, surplus_share
from nego.market.marketplace import Job, Marketplace, child_seeds
from nego.market.protocol import ProtocolConfig
from nego.market.transcript_rows import negotiation_row
from nego.scenarios.analysis import analyse, offer_at, utilities
from nego.scenarios.scenario import Role

from tests.conftest import make_widget_scenario
from tests.market.fakes import Factory


@pytest.fixture
def facts():
    return ZoneFacts.of(analyse(make_widget_scenario()))


def test_no_deal_scores_zero_surplus_and_zero_nash(facts):
    assert surplus_share(facts, False, facts.reservation_seller) == 0.0
    assert normalised_nash(facts, False, 0.3, 0.3) == 0.0
    assert pareto_distance(facts, False, 0.3, 0.3) is None


def test_the_nash_point_scores_one_and_sits_on_the_frontier(facts):
    a = analyse(make_widget_scenario())
    u_s, u_b = a.nash_utilities
    assert normalised_nash(facts, True, u_s, u_b) == pytest.approx(1.0)
    assert pareto_distance(facts, True, u_s, u_b) == pytest.approx(0.0)


def test_surplus_share_spans_the_zone(facts):
    best = facts.seller_best_in_zone
    assert surplus_share(facts, True, best) == pytest.approx(1.0)
    assert surplus_share(facts, True, facts.reservation_seller) == pytest.approx(0.0)
    assert surplus_share(facts, True, facts.reservation_seller - 0.1) < 0


def test_pareto_distance_of_a_dominated_outcome_is_positive(facts):
    sc = make_widget_scenario()
    u_s, u_b = utilities(sc)
    worst_joint = int(np.argmin(u_s + u_b))
    assert pareto_distance(facts, True, u_s[worst_joint], u_b[worst_joint]) > 0.1


def play(scenario, seller, buyer, seed=3):
    job = Job(scenario, seller, buyer, seed)
    (result,) = asyncio.run(Marketplace(resolve).run([job]))
    return job, result


def test_compute_metrics_flags_individual_rationality_violations():
    sc = make_widget_scenario()
    job, result = play(sc, "conceder", "boulware")
    row = negotiation_row(job, 0, result, 0.0)
    low = int(np.argmin(utilities(sc)[0]))  # an agreement below the seller's reservation
    bad = dict(row, negotiation_id="bad", agreed=True, end_reason="agreement", seller_utility=utilities(sc)[0][low])
    frame = pl.DataFrame([row, bad], orient="row", infer_schema_length=None)
    m = compute_metrics(frame, {sc.content_hash(): sc}, {"bad": 0.5})
    assert m["ir_violation"].to_list() == [False, True]
    assert m["optimality_gap"].to_list() == [None, 0.5]
    assert m["score"][0] == result.outcome.seller_utility
    assert m["invalid_rate"][0] == 0.0


def test_metrics_refuse_transcripts_of_scenarios_outside_the_suite():
    sc = make_widget_scenario()
    job, result = play(sc, "conceder", "boulware")
    with pytest.raises(KeyError, match="not in the suite"):
        compute_metrics(pl.DataFrame([negotiation_row(job, 0, result, 0.0)]), {})


@pytest.mark.parametrize("opener", [Role.SELLER, Role.BUYER])
def test_best_response_to_a_hardliner_is_exact(opener):
    # this hardliner accepts any offer worth >= 0.7 of its best: the best response is the seller's best such offer
    sc = make_widget_scenario().with_opener(opener)
    spec = "hardliner:accept=0.7"
    _, result = play(sc, "boulware", spec)
    u_s, u_b = utilities(sc)
    expected = float(u_s[u_b >= max(0.7 * u_b.max(), sc.buyer.reservation) - 1e-12].max())
    assert expected > result.outcome.seller_utility  # boulware leaves something on the table here
    value = asyncio.run(best_response_value(sc, resolve(spec), 3, result.turns, result.outcome.seller_utility))
    assert value == pytest.approx(expected)
    gap = optimality_gap(sc, resolve(spec), 3, result.turns, result.outcome.seller_utility)
    assert gap == pytest.approx(expected - result.outcome.seller_utility)


def test_best_response_against_a_walker_is_accepted_on_replay():
    sc = make_widget_scenario()
    _, result = play(sc, "linear", "walker")
    value = asyncio.run(best_response_value(sc, resolve("walker"), 3, result.turns, result.outcome.seller_utility))
    assert value >= result.outcome.seller_utility
    # the value is attained by a frontier offer the walker really accepts when made at some reached turn
    a = analyse(sc)
    assert np.isclose(a.pareto_utilities[:, 0], value).any() or value == result.outcome.seller_utility
    assert offer_at(sc, int(a.pareto_indices[0])) is not None


BUYERS = [
    "walker",
    "picky",
    "hardliner:accept=0.7",
    "boulware",
    "conceder",
    "tft",
    "random",
    "reciprocal",
    "outside",
    "hazard",
    "deadline",
    "timedep:e=1,patience=0.5",
]


@pytest.mark.parametrize("buyer", BUYERS)
def test_probing_copies_of_the_advanced_buyer_finds_what_full_replays_find(buyer):
    # every rule buyer, against sellers that concede, hold out, move at random and make invalid attempts (retried
    # with feedback, so the record holds attempts the buyer never sees), both openers, several seeds
    sellers = {"boulware": resolve("boulware"), "conceder": resolve("conceder"), "random": resolve("random")}
    sellers["clumsy"] = Factory("clumsy", invalid_first=True)
    factories = {**sellers, buyer: resolve(buyer)}
    sc = make_widget_scenario(max_rounds=8)
    jobs = [
        Job(sc.with_opener(opener), seller, buyer, seed)
        for opener in (Role.SELLER, Role.BUYER)
        for seller in sellers
        for seed in range(3)
    ]
    results = asyncio.run(Marketplace(factories).run(jobs))

    async def values(fast):
        return [
            await best_response_value(
                job.scenario, factories[buyer], job.seed, r.turns, r.outcome.seller_utility, fast=fast
            )
            for job, r in zip(jobs, results, strict=True)
        ]

    assert any(not t.valid for r in results for t in r.turns)
    assert asyncio.run(values(True)) == asyncio.run(values(False))
    config = ProtocolConfig()
    followed = [
        asyncio.run(_advance(job.scenario, factories[buyer], child_seeds(job.seed)[1], r.turns, config))
        for job, r in zip(jobs, results, strict=True)
    ]
    assert all(f is not None for f in followed)  # the buyer followed every record: its copies answer the probes
