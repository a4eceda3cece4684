"""Rule-based negotiators: individual rationality, valid offers, determinism and each family's defining rule."""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nego.agents.registry import resolve
from nego.agents.rules.base import Clock
from nego.market.protocol import run_negotiation
from nego.market.types import Action, ActionKind, Observation, Offer
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.preferences import Preferences, ValueFunction
from nego.scenarios.scenario import Role, Scenario

from ...conftest import make_widget_scenario

RULE_SPECS = [
    "boulware",
    "linear",
    "conceder",
    "timedep:e=0.5,clock=negmas",
    "timedep:e=1,margin=0.1,patience=0.5",
    "timedep:e=0.2,step=0.05",
    "tft",
    "hardliner",
    "random",
    "walker",
    "picky",
]


def random_scenario(seed: int, max_rounds: int = 8, opener: Role = Role.SELLER) -> Scenario:
    """A small random scenario: an int, a float and a categorical issue, opposing random preferences."""
    rng = np.random.default_rng(seed)
    issues = (
        Issue("price", IssueKind.INT, low=10, high=10 + 2 * int(rng.integers(2, 12)), step=2),
        Issue("days", IssueKind.FLOAT, low=0.0, high=30.0, step=float(rng.choice([2.5, 5.0, 7.5]))),
        Issue("tier", IssueKind.CATEGORICAL, options=("basic", "plus", "pro")),
    )

    def prefs(up: bool) -> Preferences:
        w = rng.dirichlet(np.ones(3))
        tier = rng.uniform(0, 1, 3)
        return Preferences(
            {"price": float(w[0]), "days": float(w[1]), "tier": float(1 - w[0] - w[1])},
            {
                "price": ValueFunction.increasing() if up else ValueFunction.decreasing(),
                "days": ValueFunction.decreasing() if up else ValueFunction.increasing(),
                "tier": ValueFunction.options(dict(zip(issues[2].options, map(float, tier), strict=True))),
            },
            reservation=float(rng.uniform(0.0, 0.7)),
        )

    return Scenario(
        f"rand-{seed}", "thing", "", issues, prefs(True), prefs(False), max_rounds=max_rounds, opener=opener
    )


def play(scenario: Scenario, seller: str, buyer: str, seed: int = 0):
    s, b = resolve(seller), resolve(buyer)
    return asyncio.run(run_negotiation(scenario, s(Role.SELLER, seed), b(Role.BUYER, seed + 1), seed=seed))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    seller=st.sampled_from(RULE_SPECS),
    buyer=st.sampled_from(RULE_SPECS),
    rounds=st.integers(1, 12),
    opener=st.sampled_from([Role.SELLER, Role.BUYER]),
)
def test_no_rule_agent_offers_or_accepts_below_its_reservation(seed, seller, buyer, rounds, opener):
    sc = random_scenario(seed, rounds, opener)
    result = play(sc, seller, buyer, seed)
    standing: dict[Role, Offer | None] = {Role.SELLER: None, Role.BUYER: None}
    for turn in result.turns:
        assert turn.valid, turn.feedback
        rv = sc.preferences(turn.role).reservation
        if turn.action.kind is ActionKind.OFFER:
            assert sc.utility(turn.role, turn.action.offer) >= rv
            standing[turn.role.other] = turn.action.offer
        elif turn.action.kind is ActionKind.ACCEPT:
            assert sc.utility(turn.role, standing[turn.role]) >= rv
    if result.outcome.agreed:
        assert result.outcome.seller_utility >= sc.seller.reservation
        assert result.outcome.buyer_utility >= sc.buyer.reservation
    again = play(sc, seller, buyer, seed)
    assert [t.action for t in again.turns] == [t.action for t in result.turns]


def obs_at(sc: Scenario, role: Role, rnd: int, standing=None, history=()) -> Observation:
    return Observation(sc.view_for(role), tuple(history), rnd, standing)


def test_timedep_opens_with_best_and_concedes_to_reservation_on_its_last_turn():
    sc = make_widget_scenario(max_rounds=10)
    agent = resolve("linear")(Role.SELLER, 0)
    first = asyncio.run(agent.act(obs_at(sc, Role.SELLER, 1)))
    assert sc.utility(Role.SELLER, first.offer) == 1.0
    barely = Offer({"price": 70, "quantity": 1, "warranty": "none"})  # seller utility 0.32 just above rv 0.3
    assert asyncio.run(agent.act(obs_at(sc, Role.SELLER, 10, barely))).kind is ActionKind.ACCEPT
    assert asyncio.run(agent.act(obs_at(sc, Role.SELLER, 9, barely))).kind is ActionKind.OFFER


def test_timedep_margin_is_a_floor_and_patience_ends_in_a_walk_away():
    sc = make_widget_scenario(max_rounds=10)
    barely = Offer({"price": 70, "quantity": 1, "warranty": "none"})  # seller utility 0.32, rv 0.3
    plain = resolve("linear")(Role.SELLER, 0)
    firm = resolve("timedep:e=1,margin=0.1")(Role.SELLER, 0)
    assert asyncio.run(plain.act(obs_at(sc, Role.SELLER, 10, barely))).kind is ActionKind.ACCEPT
    last = asyncio.run(firm.act(obs_at(sc, Role.SELLER, 10, barely)))
    assert last.kind is ActionKind.OFFER and sc.utility(Role.SELLER, last.offer) >= 0.4 - 1e-9
    impatient = resolve("timedep:e=1,patience=0.5")(Role.SELLER, 0)
    kinds = [asyncio.run(impatient.act(obs_at(sc, Role.SELLER, r))).kind for r in range(1, 11)]
    # relative time (r - 1) / 9 exceeds 0.5 from round 6 on
    assert kinds == [ActionKind.OFFER] * 5 + [ActionKind.WALK_AWAY] * 5
    good = Offer({"price": 100, "quantity": 1, "warranty": "none"})
    assert asyncio.run(impatient.act(obs_at(sc, Role.SELLER, 8, good))).kind is ActionKind.ACCEPT


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), step=st.floats(0.005, 0.2), e=st.floats(0.1, 3.0))
def test_timedep_step_aims_at_least_step_below_its_previous_offer(seed, step, e):
    """With ``step``, each offer is the cheapest outcome at or above min(schedule, previous offer - step) (and the
    floor): never above the plain schedule's offer, and at least step below the previous one wherever the grid has an
    outcome in between."""
    from nego.agents.rules.base import EPS
    from nego.agents.rules.search import OutcomeSpace

    sc = random_scenario(seed, max_rounds=10)
    agent = resolve(f"timedep:e={e},step={step}")(Role.SELLER, 0)
    plain = resolve(f"timedep:e={e}")(Role.SELLER, 0)
    space = OutcomeSpace(sc.issues, sc.seller)
    rv = sc.seller.reservation
    view = sc.view_for(Role.SELLER)  # one negotiation: the same view every turn, as the protocol gives it
    previous = None
    for rnd in range(1, 11):
        obs = Observation(view, (), rnd, None)
        action, alone = asyncio.run(agent.act(obs)), asyncio.run(plain.act(obs))
        if alone.kind is not ActionKind.OFFER:  # no outcome is worth the reservation value
            assert action.kind is alone.kind
            return
        aim = plain.target(obs) if previous is None else min(plain.target(obs), previous - step)
        index = space.at_least(max(aim - EPS, rv + EPS)) or space.best_index
        assert action.offer == space.offer(index)
        u = sc.utility(Role.SELLER, action.offer)
        assert u <= sc.utility(Role.SELLER, alone.offer) + 1e-12
        previous = u


def test_timedep_step_is_validated_and_zero_by_default():
    sc = make_widget_scenario(max_rounds=10)
    plain, zero = resolve("boulware")(Role.SELLER, 0), resolve("timedep:e=0.2,step=0")(Role.SELLER, 0)
    for rnd in range(1, 11):
        a, b = (asyncio.run(x.act(obs_at(sc, Role.SELLER, rnd))) for x in (plain, zero))
        assert a == b
    for bad in ("timedep:e=1,step=-0.1", "timedep:e=1,step=1"):
        try:
            resolve(bad)(Role.SELLER, 0)
        except ValueError as e:
            assert "step must lie in [0, 1)" in str(e)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_timedep_offers_smallest_utility_at_or_above_target():
    sc = make_widget_scenario(max_rounds=11)
    agent = resolve("linear")(Role.BUYER, 0)
    for rnd in range(1, 12):
        action = asyncio.run(agent.act(obs_at(sc, Role.BUYER, rnd)))
        target = 1.0 - 0.7 * (rnd - 1) / 10
        grid = [dict(zip(("price", "quantity", "warranty"), v, strict=True)) for v in _grid(sc)]
        utils = sorted(u for u in (sc.utility(Role.BUYER, o) for o in grid) if u >= max(target - 1e-9, 0.3 + 1e-9))
        assert abs(sc.utility(Role.BUYER, action.offer) - utils[0]) < 1e-9


def _grid(sc):
    import itertools

    return itertools.product(*(i.grid() for i in sc.issues))


def test_negmas_clock_never_reaches_zero_or_one():
    sc = make_widget_scenario(max_rounds=20)
    assert Clock.NEGMAS.time(obs_at(sc, Role.SELLER, 1)) == 1 / 21
    assert Clock.NEGMAS.time(obs_at(sc, Role.SELLER, 20)) == 20 / 21
    assert Clock.OWN.time(obs_at(sc, Role.SELLER, 1)) == 0.0 and Clock.OWN.time(obs_at(sc, Role.SELLER, 20)) == 1.0


def test_tft_concedes_by_the_opponents_concession():
    sc = make_widget_scenario(max_rounds=10)
    view = sc.view_for(Role.SELLER)
    agent = resolve("tft")(Role.SELLER, 0)
    o1 = Offer({"price": 60, "quantity": 5, "warranty": "2y"})
    o2 = Offer({"price": 80, "quantity": 5, "warranty": "2y"})
    from nego.market.types import PublicMove

    h = [PublicMove(1, Role.BUYER, ActionKind.OFFER, o1)]
    asyncio.run(agent.act(obs_at(sc, Role.SELLER, 2, o1, h)))
    h.append(PublicMove(2, Role.BUYER, ActionKind.OFFER, o2))
    act = asyncio.run(agent.act(obs_at(sc, Role.SELLER, 3, o2, h)))
    gain = view.utility(o2) - view.utility(o1)
    assert abs(agent._target - (1.0 - gain)) < 1e-12
    assert 1.0 - gain - 1e-9 <= view.utility(act.offer) < 1.0


def test_hardliner_offers_only_its_best():
    result = play(make_widget_scenario(max_rounds=6), "hardliner", "conceder")
    offers = {t.action.offer for t in result.turns if t.role is Role.SELLER and t.action.kind is ActionKind.OFFER}
    assert len(offers) == 1 and make_widget_scenario().utility(Role.SELLER, offers.pop()) == 1.0


def test_walker_leaves_a_stalling_opponent_early():
    result = play(make_widget_scenario(max_rounds=20), "hardliner", "walker")
    assert result.outcome.end_reason.value == "walk_away" and result.outcome.ended_by is Role.BUYER
    assert result.outcome.rounds <= 5


def test_picky_never_accepts_below_reservation_plus_margin_even_at_the_deadline():
    sc = make_widget_scenario(max_rounds=4)
    agent = resolve("picky")(Role.SELLER, 0)
    barely = Offer({"price": 70, "quantity": 1, "warranty": "none"})  # 0.32: rational but below rv + 0.15
    assert asyncio.run(agent.act(obs_at(sc, Role.SELLER, 4, barely))).kind is not ActionKind.ACCEPT
    good = Offer({"price": 150, "quantity": 10, "warranty": "1y"})  # 0.9
    assert asyncio.run(agent.act(obs_at(sc, Role.SELLER, 4, good))).kind is ActionKind.ACCEPT


def test_random_is_seeded_per_agent():
    sc = random_scenario(5, max_rounds=6)
    a = [play(sc, "random", "random", seed=s).turns for s in (1, 1, 2)]
    assert [t.action for t in a[0]] == [t.action for t in a[1]]
    assert [t.action for t in a[0]] != [t.action for t in a[2]]


def test_no_rational_outcome_means_walk_away():
    sc = make_widget_scenario()
    from dataclasses import replace

    sc = replace(sc, seller=replace(sc.seller, reservation=1.0))
    for spec in RULE_SPECS:
        action = asyncio.run(resolve(spec)(Role.SELLER, 0).act(obs_at(sc, Role.SELLER, 1)))
        assert action == Action.walk_away(), spec


class _Recording:
    """Wraps a negotiator and keeps every observation it was asked to act on, with its action."""

    def __init__(self, agent):
        self.agent, self.seen = agent, []

    async def act(self, obs):
        action = await self.agent.act(obs)
        self.seen.append((obs, action))
        return action


def _timedep_by_the_rule(agent, obs: Observation) -> Action:
    """The documented time-dependent rule, worked out afresh on each turn."""
    from nego.agents.rules.base import EPS, acceptable, cheapest_at_least, concession_target
    from nego.agents.rules.search import OutcomeSpace

    space = OutcomeSpace(obs.scenario.issues, obs.scenario.preferences)
    floor = obs.scenario.preferences.reservation + agent.margin
    if space.best < floor + EPS:
        return Action.walk_away()
    t = agent.clock.time(obs)
    target = concession_target(space, max(floor, space.worst), t, agent.e)
    if acceptable(obs, max(target, floor), space):
        return Action.accept()
    if t > agent.patience:
        return Action.walk_away()
    return Action.make_offer(space.offer(cheapest_at_least(space, target, floor)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    spec=st.sampled_from(["boulware", "conceder", "timedep:e=0.5,clock=negmas", "timedep:e=1,margin=0.1,patience=0.6"]),
    other=st.sampled_from(["conceder", "tft", "random", "hardliner"]),
    rounds=st.sampled_from([1, 2, 9, 31, 32, 33, 70]),
    role=st.sampled_from([Role.SELLER, Role.BUYER]),
)
def test_timedep_plans_ahead_with_the_moves_it_would_work_out_each_turn(seed, spec, other, rounds, role):
    sc = random_scenario(seed, max_rounds=rounds, opener=role.other if seed % 2 else role)
    agent = _Recording(resolve(spec)(role, seed))
    rival = resolve(other)(role.other, seed + 1)
    seller, buyer = (agent, rival) if role is Role.SELLER else (rival, agent)
    asyncio.run(run_negotiation(sc, seller, buyer, seed=seed))
    for obs, action in agent.seen:
        expected = _timedep_by_the_rule(agent.agent, obs)
        assert (action.kind, action.offer) == (expected.kind, expected.offer), obs.round
