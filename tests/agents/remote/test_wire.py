"""The remote-agent wire format: lossless round trips and clear refusals of malformed bodies."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.remote.wire import (
    WIRE_VERSION,
    WireError,
    action_from_dict,
    action_to_dict,
    observation_from_dict,
    observation_to_dict,
)
from nego.market.types import Action, ActionKind, Observation, Offer, PublicMove, Usage
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.limits import MAX_ISSUE_POINTS, MAX_ROUNDS
from nego.scenarios.preferences import Preferences, ValueFunction
from nego.scenarios.scenario import Role, Scenario

from ...conftest import make_widget_scenario


def float_scenario() -> Scenario:
    issues = (
        Issue("rate", IssueKind.FLOAT, low=0.5, high=2.25, step=0.25, unit="%", description="interest"),
        Issue("term", IssueKind.CATEGORICAL, options=("short", "long")),
    )
    prefs = Preferences(
        {"rate": 0.7, "term": 0.3},
        {"rate": ValueFunction.increasing(), "term": ValueFunction.options({"short": 0.2, "long": 1.0})},
        reservation=0.25,
    )
    return Scenario("loan-9", "a loan", "", issues, prefs, prefs, max_rounds=4, seller_brief="sb", buyer_brief="bb")


def offers(scenario: Scenario) -> st.SearchStrategy[Offer]:
    return st.fixed_dictionaries({i.name: st.sampled_from(i.grid()) for i in scenario.issues}).map(Offer)


def moves(scenario: Scenario) -> st.SearchStrategy[PublicMove]:
    return st.builds(
        PublicMove,
        round=st.integers(1, scenario.max_rounds),
        role=st.sampled_from(Role),
        kind=st.just(ActionKind.OFFER),
        offer=offers(scenario),
        message=st.text(max_size=30),
    ) | st.builds(
        PublicMove,
        round=st.integers(1, scenario.max_rounds),
        role=st.sampled_from(Role),
        kind=st.sampled_from([ActionKind.ACCEPT, ActionKind.WALK_AWAY]),
        offer=st.none(),
        message=st.text(max_size=30),
    )


@st.composite
def observations(draw: st.DrawFn) -> Observation:
    scenario = draw(st.sampled_from([make_widget_scenario("S-brief", "B-brief"), float_scenario()]))
    return Observation(
        scenario=scenario.view_for(draw(st.sampled_from(Role))),
        history=tuple(draw(st.lists(moves(scenario), max_size=5))),
        round=draw(st.integers(1, scenario.max_rounds)),
        standing_offer=draw(st.none() | offers(scenario)),
        feedback=draw(st.none() | st.text(max_size=40)),
        attempt=draw(st.integers(0, 3)),
    )


def through_json(d: dict) -> dict:
    return json.loads(json.dumps(d))


@settings(max_examples=60, deadline=None)
@given(observations())
def test_observation_round_trip_is_lossless(obs: Observation):
    back = observation_from_dict(through_json(observation_to_dict(obs)))
    assert back == obs
    for before, after in zip(
        (obs.standing_offer, *(m.offer for m in obs.history)),
        (back.standing_offer, *(m.offer for m in back.history)),
        strict=True,
    ):
        if before is not None:  # ints stay ints and floats stay floats
            assert {k: type(v) for k, v in after.items()} == {k: type(v) for k, v in before.items()}


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(
        [
            Action.accept("fine"),
            Action.walk_away(),
            Action.invalid("garbled {", "no JSON object found", Usage(10, 3, 0.5, 0.001, 1)),
        ]
    )
    | st.builds(Action.make_offer, offers(make_widget_scenario()), st.text(max_size=20))
)
def test_action_round_trip_is_lossless(action: Action):
    assert action_from_dict(through_json(action_to_dict(action))) == action


def test_observation_holds_only_the_receiving_sides_private_part():
    sc = make_widget_scenario(seller_brief="CANARY-S-1", buyer_brief="CANARY-B-2")
    body = json.dumps(observation_to_dict(Observation(sc.view_for(Role.BUYER), (), 1, None)))
    assert "CANARY-B-2" in body and "CANARY-S-1" not in body
    assert json.loads(body)["scenario"]["preferences"]["values"]["warranty"] == {"none": 0.0, "1y": 0.6, "2y": 1.0}


def good_obs_dict() -> dict:
    sc = make_widget_scenario()
    offer = Offer({"price": 100, "quantity": 5, "warranty": "1y"})
    obs = Observation(sc.view_for(Role.BUYER), (PublicMove(1, Role.SELLER, ActionKind.OFFER, offer),), 1, offer)
    return through_json(observation_to_dict(obs))


def mutate(d: dict, path: tuple, value: object) -> dict:
    target = d
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("v",), 99, "observation.v: unsupported wire version 99"),
        (("round",), "1", "observation.round: expected an integer"),
        (("round",), 7, "past the scenario's max_rounds 6"),
        (("attempt",), -1, "observation.attempt: must be >= 0"),
        (("scenario", "role"), "broker", "observation.scenario.role: must be one of seller, buyer"),
        (("scenario", "issues", 0, "low"), "cheap", "observation.scenario.issues[0].low: expected a finite number"),
        (("scenario", "issues", 0, "high"), 10, "issues[0]: issue 'price': high: high (10) must exceed low (50)"),
        (("scenario", "preferences", "weights", "price"), 0.9, "weights must sum to 1"),
        (("scenario", "preferences", "values", "price"), "upwards", "values.price: must be one of increasing"),
        (("scenario", "preferences", "values", "warranty"), KeyError, "values: must name exactly the issues"),
        (("scenario", "secret"), 1, "observation.scenario: unknown field(s) 'secret'"),
        (("history", 0, "kind"), "invalid", "history[0].kind: a public move is offer, accept or walk_away"),
        (("history", 0, "offer"), None, "history[0].offer: an offer move carries an offer"),
        (("standing_offer", "price"), 151, "observation.standing_offer: price must be between 50 and 150"),
        (("standing_offer", "colour"), "red", "observation.standing_offer: must assign exactly the issues"),
        (("feedback",), 3, "observation.feedback: expected a string"),
        (("history",), {}, "observation.history: expected a list"),
    ],
)
def test_malformed_observation_is_refused_naming_the_field(path, value, message):
    with pytest.raises(WireError) as err:
        observation_from_dict(mutate(good_obs_dict(), path, value))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "action: expected an object, got list"),
        ({"kind": "accept"}, "action.v: unsupported wire version None"),
        ({"v": WIRE_VERSION, "kind": "bid"}, "action.kind: must be one of offer, accept, walk_away, invalid"),
        ({"v": WIRE_VERSION, "kind": "offer"}, "action.offer: kind 'offer' needs an offer object"),
        ({"v": WIRE_VERSION, "kind": "accept", "offer": {"price": 5}}, "other kinds must not carry one"),
        ({"v": WIRE_VERSION, "kind": "offer", "offer": {"price": [5]}}, "action.offer.price: expected a number"),
        ({"v": WIRE_VERSION, "kind": "offer", "offer": {"price": True}}, "action.offer.price: expected a number"),
        ({"v": WIRE_VERSION, "kind": "accept", "usage": {"calls": -1}}, "action.usage.calls: must be >= 0"),
        ({"v": WIRE_VERSION, "kind": "accept", "sneaky": 1}, "action: unknown field(s) 'sneaky'"),
    ],
)
def test_malformed_action_is_refused_naming_the_field(body, message):
    with pytest.raises(WireError) as err:
        action_from_dict(body)
    assert message in str(err.value)


def test_out_of_range_offer_passes_the_wire_for_the_protocol_to_judge():
    action = action_from_dict({"v": WIRE_VERSION, "kind": "offer", "offer": {"price": 10_000}})
    assert action.kind is ActionKind.OFFER and action.offer == {"price": 10_000}


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value in a JSON-like tree."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, child in node.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for k, child in enumerate(node):
            out += _paths(child, (*prefix, k))
    return out


HOSTILE = st.sampled_from(
    [
        None,
        True,
        0,
        -1,
        10**6,
        10**7,
        2**63,
        10**400,
        1e-320,
        1e-8,
        1e308,
        -1e308,
        float("nan"),
        float("inf"),
        "",
        "x" * 300,
        [],
        {},
        [[[[[[[[]]]]]]]],
        {"a": {"b": {"c": 1}}},
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_mutated_observation_is_decoded_or_refused_with_a_wire_error(data: st.DataObject):
    obs = good_obs_dict()
    paths = _paths(obs)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        try:
            mutate(obs, path, data.draw(HOSTILE))
        except (KeyError, IndexError, TypeError):  # an earlier mutation replaced a parent of this path
            continue
    try:
        back = observation_from_dict(obs)
    except WireError as e:
        assert str(e).startswith("observation")
    else:
        assert back.scenario.max_rounds <= MAX_ROUNDS
        assert all(i.size <= MAX_ISSUE_POINTS for i in back.scenario.issues)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("scenario", "max_rounds"), 10**9, "observation.scenario.max_rounds: must lie in 1..1000, got 1000000000"),
        (("scenario", "max_rounds"), 2**63, "observation.scenario.max_rounds: must lie in 1..1000"),
        (("scenario", "issues", 0, "high"), 10_000_000, "issues[0]: issue 'price': step: the range 50..10000000"),
        (("scenario", "issues", 0, "low"), 10**400, "issues[0].low: expected a finite number"),
        (("scenario", "preferences", "reservation"), 10**400, "reservation: expected a finite number"),
        (("scenario", "issues", 2, "options"), [f"o{k}" for k in range(10_001)], "10,001 options (limit 10,000)"),
        (("history",), [{"round": 1, "role": "seller", "kind": "walk_away"}] * 13, "13 moves, more than two per"),
    ],
)
def test_an_observation_past_the_limits_is_refused_naming_the_field(path, value, message):
    with pytest.raises(WireError) as err:
        observation_from_dict(mutate(good_obs_dict(), path, value))
    assert message in str(err.value)
