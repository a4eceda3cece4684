"""Buyers that punish a stalling seller (reciprocal, outside, hazard, deadline): their rules, their guarantees, and
the behaviour that tells each apart, measured through the Marketplace."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nego.agents.check import check_negotiator
from nego.agents.registry import _FAMILIES, UnknownSpecError, resolve, rule_family, rule_specs
from nego.agents.rules.concession import OpponentOffers, weighted_trend
from nego.market.marketplace import Job, run_jobs
from nego.market.protocol import run_negotiation
from nego.market.types import ActionKind, EndReason, Observation, Offer, PublicMove
from nego.scenarios.generator import generate_scenarios
from nego.scenarios.scenario import Role, Scenario

from ...conftest import make_widget_scenario
from .test_rules import random_scenario

FAMILIES = ("reciprocal", "outside", "hazard", "deadline")
VARIANTS = (
    "reciprocal:r=0.5,harden=1,tol=0",
    "outside:low=0,high=1,e=0.5,memory=1,min_offers=1",
    "hazard:quit=1,expect=0.2,memory=0,e=3",
    "deadline:early=0.1,late=0.2,e=0.5",
)
LADDER = ("hardliner", "boulware", "linear", "conceder")


def seller_offer(price: int, quantity: int = 1, warranty: str = "none") -> Offer:
    """A widget offer; the buyer's utility is 0.5 (150 - price) / 100 + 0.1 (quantity - 1) / 9 + 0.4 warranty."""
    return Offer({"price": price, "quantity": quantity, "warranty": warranty})


def buyer_obs(sc: Scenario, rnd: int, offers: list[Offer]) -> Observation:
    """The buyer's observation in round ``rnd`` of a seller-opened negotiation where the seller made ``offers``."""
    history = tuple(PublicMove(i + 1, Role.SELLER, ActionKind.OFFER, o) for i, o in enumerate(offers))
    return Observation(sc.view_for(Role.BUYER), history, rnd, offers[-1] if offers else None)


def act(agent, obs: Observation):
    return asyncio.run(agent.act(obs))


# --- registry and conformance -------------------------------------------------------------------------------


def test_every_registered_family_is_in_the_registry_wide_conformance_list():
    """tests/agents/test_check.py runs check_negotiator over rule_specs(): every family must be named there."""
    assert {rule_family(s) for s in rule_specs()} == set(_FAMILIES)


@pytest.mark.parametrize("spec", VARIANTS)
def test_non_default_parameters_pass_the_conformance_check(spec):
    report = check_negotiator(spec)
    assert report.spec == resolve(spec).spec and report.turns > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_every_parameter_takes_a_pool_drawn_number(family):
    """A training pool writes ``key=a..b`` draws as numbers with three decimals; each parameter must take one."""
    params = _FAMILIES[family].params
    assert params and all(p.kind is float and p.default is not None for p in params.values())
    for key, p in params.items():
        factory = resolve(f"{family}:{key}={float(p.default):.3f}")
        assert factory.spec == family  # the default, however written, is the canonical plain name


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("reciprocal:r=0", "r must be positive"),
        ("reciprocal:harden=1.5", "harden must lie in [0, 1]"),
        ("outside:low=0.6,high=0.5", "0 <= low <= high <= 1"),
        ("outside:memory=0", "memory must lie in (0, 1]"),
        ("outside:min_offers=0.5", "min_offers must be at least 1"),
        ("hazard:quit=2", "quit must lie in [0, 1]"),
        ("hazard:expect=0", "expect must be positive"),
        ("deadline:early=0", "0 < early <= late <= 1"),
        ("deadline:early=0.9,late=0.5", "0 < early <= late <= 1"),
        ("outside:patience=1", "allowed: low, high, e, memory, min_offers"),
    ],
)
def test_bad_parameters_are_refused_with_the_rule(spec, fragment):
    with pytest.raises(UnknownSpecError) as err:
        resolve(spec)
    assert fragment in str(err.value)


# --- guarantees ----------------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    buyer=st.sampled_from(FAMILIES + VARIANTS),
    seller=st.sampled_from((*LADDER, "tft", "random", *FAMILIES)),
    rounds=st.integers(1, 12),
    opener=st.sampled_from([Role.SELLER, Role.BUYER]),
)
def test_never_offers_or_accepts_below_reservation(seed, buyer, seller, rounds, opener):
    """Either side, when it is one of the new families (they play the seller role too)."""
    sc = random_scenario(seed, rounds, opener)
    s, b = resolve(seller), resolve(buyer)
    result = asyncio.run(run_negotiation(sc, s(Role.SELLER, seed), b(Role.BUYER, seed + 1), seed=seed))
    standing: dict[Role, Offer | None] = {Role.SELLER: None, Role.BUYER: None}  # the offer each side may accept
    for turn in result.turns:
        assert turn.valid, turn.feedback
        rv = sc.preferences(turn.role).reservation
        if turn.action.kind is ActionKind.OFFER:
            assert sc.utility(turn.role, turn.action.offer) >= rv
            standing[turn.role.other] = turn.action.offer
        elif turn.action.kind is ActionKind.ACCEPT:
            assert sc.utility(turn.role, standing[turn.role]) >= rv
    if result.outcome.agreed:
        assert result.outcome.buyer_utility >= sc.buyer.reservation
        assert result.outcome.seller_utility >= sc.seller.reservation


SCENARIOS = [s.with_opener((Role.SELLER, Role.BUYER)[i % 2]) for i, s in enumerate(generate_scenarios(50, 4242))]


def play_all(seller: str, buyer: str, seed: int = 0, scenarios=SCENARIOS):
    return run_jobs(resolve, [Job(sc, seller, buyer, seed=seed + i) for i, sc in enumerate(scenarios)])


def moves(results) -> list[list]:
    return [[(t.role, t.action) for t in r.turns] for r in results]


@pytest.mark.parametrize("buyer", FAMILIES)
def test_deterministic_per_seed(buyer):
    assert moves(play_all("boulware", buyer, seed=7)) == moves(play_all("boulware", buyer, seed=7))


@pytest.mark.parametrize("buyer", ["outside", "hazard", "deadline"])
def test_the_stochastic_families_differ_across_seeds(buyer):
    assert moves(play_all("boulware", buyer, seed=7)) != moves(play_all("boulware", buyer, seed=8))


def test_private_draws_follow_the_seed_within_their_ranges():
    sc = make_widget_scenario(max_rounds=10)
    obs = buyer_obs(sc, 1, [seller_offer(150)])
    rv = sc.buyer.reservation
    outsides, deadlines = set(), set()
    for seed in range(20):
        outside = resolve("outside:low=0.2,high=0.4")(Role.BUYER, seed)
        deadline = resolve("deadline:early=0.5,late=0.7")(Role.BUYER, seed)
        act(outside, obs)
        act(deadline, obs)
        assert rv + 0.2 * (1 - rv) - 1e-12 <= outside.outside <= rv + 0.4 * (1 - rv) + 1e-12
        assert 0.5 <= deadline.deadline <= 0.7
        outsides.add(outside.outside)
        deadlines.add(deadline.deadline)
    assert len(outsides) == len(deadlines) == 20


# --- each family's rule ------------------------------------------------------------------------------------------


def test_weighted_trend_recovers_a_line_and_weighs_recent_values():
    for memory in (0.3, 0.7, 1.0):
        level, slope = weighted_trend([0.1, 0.3, 0.5, 0.7], memory)
        assert level == pytest.approx(0.7) and slope == pytest.approx(0.2)
    assert weighted_trend([0.4], 0.5) == (0.4, 0.0)
    assert weighted_trend([0.0, 0.2, 0.4, 0.4, 0.4], 0.3)[1] < weighted_trend([0.0, 0.2, 0.4, 0.4, 0.4], 1.0)[1]
    ys = [0.5, 0.1, 0.4, 0.2]
    slope, intercept = np.polyfit([-3, -2, -1, 0], ys, 1)  # equal weights: ordinary least squares
    assert weighted_trend(ys, 1.0) == pytest.approx((intercept, slope))


def test_gains_count_only_new_ground():
    sc = make_widget_scenario(max_rounds=10)
    buyer = resolve("reciprocal")(Role.BUYER, 0)
    offers = [seller_offer(150), seller_offer(130), seller_offer(150), seller_offer(130), seller_offer(110)]
    tracker = OpponentOffers(buyer.space(buyer_obs(sc, 1, offers[:1])))
    gains = tracker.update(buyer_obs(sc, 5, offers))
    assert gains == pytest.approx([0.1, -0.1, 0.0, 0.1])
    assert tracker.update(buyer_obs(sc, 5, offers)) == []


def test_reciprocal_matches_concessions_and_hardens_on_a_stall():
    sc = make_widget_scenario(max_rounds=10)
    buyer = resolve("reciprocal:r=0.5,harden=0.25")(Role.BUYER, 0)
    offers = [seller_offer(150), seller_offer(110)]  # buyer utility 0 -> 0.2
    first = act(buyer, buyer_obs(sc, 1, offers[:1]))
    assert first.kind is ActionKind.OFFER and sc.utility(Role.BUYER, first.offer) == pytest.approx(1.0)
    act(buyer, buyer_obs(sc, 2, offers))
    assert buyer.target == pytest.approx(1.0 - 0.5 * 0.2)
    offers.append(seller_offer(110))  # no new ground: harden a quarter of the way back to its best
    third = act(buyer, buyer_obs(sc, 3, offers))
    assert buyer.target == pytest.approx(0.9 + 0.25 * 0.1)
    assert sc.utility(Role.BUYER, third.offer) >= buyer.target - 1e-9


def test_reciprocal_accepts_what_beats_its_next_offer_and_nothing_less_at_the_deadline():
    sc = make_widget_scenario(max_rounds=4)
    buyer = resolve("reciprocal")(Role.BUYER, 0)
    offers = [seller_offer(150), seller_offer(150), seller_offer(150), seller_offer(70)]  # the last: 0.4
    actions = [act(buyer, buyer_obs(sc, r, offers[:r])) for r in (1, 2, 3, 4)]
    assert [a.kind for a in actions] == [ActionKind.OFFER] * 4  # rational (rv 0.3) but far below its target
    generous = resolve("reciprocal")(Role.BUYER, 0)
    best = seller_offer(50, 10, "2y")
    assert act(generous, buyer_obs(sc, 1, [best])).kind is ActionKind.ACCEPT


def test_outside_option_accepts_at_its_option_and_leaves_a_flat_trend():
    sc = make_widget_scenario(max_rounds=10)
    make = resolve("outside:low=0.3,high=0.3,min_offers=3")
    outside = 0.3 + 0.3 * 0.7
    above = seller_offer(60, 1, "1y")  # 0.45 + 0.24 = 0.69, above the option 0.51
    buyer = make(Role.BUYER, 0)
    assert act(buyer, buyer_obs(sc, 1, [above])).kind is ActionKind.ACCEPT
    assert buyer.outside == pytest.approx(outside)
    between = seller_offer(70)  # 0.4: above its reservation 0.3, below its option 0.51
    for r in (1, 10):
        assert act(make(Role.BUYER, 0), buyer_obs(sc, r, [between] * r)).kind is not ActionKind.ACCEPT
    flat = [seller_offer(150)] * 3
    kinds = [act(b, buyer_obs(sc, r, flat[:r])).kind for b in [make(Role.BUYER, 0)] for r in (1, 2, 3)]
    assert kinds == [ActionKind.OFFER, ActionKind.OFFER, ActionKind.WALK_AWAY]
    steep = [seller_offer(150), seller_offer(130), seller_offer(110)]  # +0.1 per offer, 7 offers to come
    buyer = make(Role.BUYER, 0)
    kinds = [act(buyer, buyer_obs(sc, r, steep[:r])).kind for r in (1, 2, 3)]
    assert kinds == [ActionKind.OFFER] * 3  # forecast 0.2 + 0.1 * 7 clears the option


def test_outside_option_never_offers_below_its_option():
    sc = make_widget_scenario(max_rounds=10)
    buyer = resolve("outside:low=0.5,high=0.5,min_offers=100")(Role.BUYER, 0)
    offers = [seller_offer(150)] * 10
    for r in range(1, 11):
        action = act(buyer, buyer_obs(sc, r, offers[:r]))
        assert action.kind is ActionKind.OFFER and sc.utility(Role.BUYER, action.offer) >= buyer.outside - 1e-9


def test_hazard_rises_with_stalling_and_time():
    sc = make_widget_scenario(max_rounds=10)
    buyer = resolve("hazard:quit=0.4,expect=0.1,memory=0.5")(Role.BUYER, 0)
    assert buyer.hazard(0.5) == 0.0  # no pace before two offers
    act(buyer, buyer_obs(sc, 2, [seller_offer(150), seller_offer(140)]))  # gain 0.05: half the expected pace
    assert buyer.pace == pytest.approx(0.05)
    assert buyer.hazard(0.0) == pytest.approx(0.4 * 0.5 * 0.5) and buyer.hazard(1.0) == pytest.approx(0.4 * 0.5)
    act(buyer, buyer_obs(sc, 3, [seller_offer(150), seller_offer(140), seller_offer(140)]))  # no gain
    assert buyer.pace == pytest.approx(0.025) and buyer.hazard(0.0) == pytest.approx(0.4 * 0.75 * 0.5)


def test_hazard_leaves_surely_at_full_hazard_and_never_without_it():
    sc = make_widget_scenario(max_rounds=10)
    flat = [seller_offer(150)] * 10
    sure = resolve("hazard:quit=1,expect=1,memory=0")(Role.BUYER, 3)
    assert act(sure, buyer_obs(sc, 10, flat)).kind is ActionKind.WALK_AWAY  # hazard (1 + 1) / 2 = 1
    for seed in range(10):
        calm = resolve("hazard:quit=0")(Role.BUYER, seed)
        assert all(act(calm, buyer_obs(sc, r, flat[:r])).kind is ActionKind.OFFER for r in range(1, 11))


def test_deadline_concedes_to_its_reservation_by_its_deadline_then_leaves():
    sc = make_widget_scenario(max_rounds=11)  # relative time (round - 1) / 10
    buyer = resolve("deadline:early=0.5,late=0.5,e=1")(Role.BUYER, 0)
    offers = [seller_offer(150)] * 11
    utilities = []
    for r in range(1, 6):
        action = act(buyer, buyer_obs(sc, r, offers[:r]))
        assert action.kind is ActionKind.OFFER
        utilities.append(sc.utility(Role.BUYER, action.offer))
    targets = [1.0 - 0.7 * (r - 1) / 5 for r in range(1, 6)]  # reaches rv 0.3 at t = 0.5
    assert all(t - 1e-9 <= u for u, t in zip(utilities, targets, strict=True))
    assert act(buyer, buyer_obs(sc, 6, offers[:6])).kind is ActionKind.WALK_AWAY
    rational = seller_offer(100, 1, "1y")  # 0.25 + 0.24 = 0.49: above rv, so taken at the deadline
    assert act(buyer, buyer_obs(sc, 6, [*offers[:5], rational])).kind is ActionKind.ACCEPT


# --- what tells the families apart (50 generated scenarios through the Marketplace) --------------------------


def seller_mean(results) -> float:
    return float(np.mean([r.outcome.seller_utility for r in results]))


def deal_rate(results) -> float:
    return float(np.mean([r.outcome.agreed for r in results]))


def walk_rate(results) -> float:
    return float(
        np.mean([r.outcome.end_reason is EndReason.WALK_AWAY and r.outcome.ended_by is Role.BUYER for r in results])
    )


def test_reciprocal_rewards_a_conceder_and_starves_a_hardliner():
    conceder, hardliner = play_all("conceder", "reciprocal"), play_all("hardliner", "reciprocal")
    assert deal_rate(conceder) >= deal_rate(hardliner) + 0.5
    assert seller_mean(conceder) > seller_mean(hardliner) + 0.1
    assert walk_rate(hardliner) == 0.0  # it never leaves by itself: the hardliner simply reaches the deadline
    assert all(r.outcome.end_reason is EndReason.DEADLINE for r in hardliner if not r.outcome.agreed)


@pytest.mark.parametrize("buyer", ["outside", "hazard", "deadline"])
def test_stall_punishers_walk_away_from_stalling_sellers_more_often(buyer):
    conceder = walk_rate(play_all("conceder", buyer))
    for staller in ("hardliner", "boulware"):
        assert walk_rate(play_all(staller, buyer)) >= conceder + 0.2, staller


@pytest.mark.parametrize("buyer", FAMILIES)
def test_holding_out_costs_the_seller(buyer):
    """Against each family a Boulware seller scores less than a linear one (the default training pool's
    margin buyers reward the Boulware seller instead)."""
    assert seller_mean(play_all("boulware", buyer)) < seller_mean(play_all("linear", buyer))
