"""The analysis must equal brute force on small random spaces, and map outcomes to offers and back."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.scenarios.analysis import analyse, index_of, offer_at, outcome_space, utilities
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.preferences import Preferences, ValueFunction
from nego.scenarios.scenario import Scenario


@st.composite
def small_scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, 3))
    issues = []
    for k in range(n):
        kind = draw(st.sampled_from(list(IssueKind)))
        if kind is IssueKind.CATEGORICAL:
            m = draw(st.integers(2, 4))
            issues.append(Issue(f"i{k}", kind, options=tuple(f"o{j}" for j in range(m))))
        elif kind is IssueKind.INT:
            issues.append(Issue(f"i{k}", kind, low=0, high=draw(st.integers(1, 5))))
        else:
            issues.append(Issue(f"i{k}", kind, low=0.0, high=1.0, step=draw(st.sampled_from([0.25, 0.5]))))
    issues_t = tuple(issues)
    return Scenario("rand", "p", "c", issues_t, _prefs(draw, issues_t), _prefs(draw, issues_t))


def _prefs(draw: st.DrawFn, issues: tuple[Issue, ...]) -> Preferences:
    # Values on a coarse lattice make exact ties (several outcomes with the same utilities) common.
    raw = [draw(st.integers(1, 4)) for _ in issues]
    weights = {i.name: r / sum(raw) for i, r in zip(issues, raw, strict=True)}
    values = {}
    for i in issues:
        if i.kind is IssueKind.CATEGORICAL:
            values[i.name] = ValueFunction.options({o: draw(st.sampled_from([0.0, 0.5, 1.0])) for o in i.options})
        else:
            values[i.name] = draw(st.sampled_from([ValueFunction.increasing(), ValueFunction.decreasing()]))
    return Preferences(weights, values, draw(st.sampled_from([0.0, 0.2, 0.4, 0.6, 0.9])))


def _brute(s: Scenario) -> list[tuple[dict, float, float]]:
    grids = [i.grid() for i in s.issues]
    out = []
    for combo in itertools.product(*grids):
        offer = dict(zip([i.name for i in s.issues], combo, strict=True))
        # The analysis decides ties at 12 decimals (its documented precision); so does the brute force.
        out.append((offer, round(s.seller.utility(offer, s.issues), 12), round(s.buyer.utility(offer, s.issues), 12)))
    return out


@settings(max_examples=60, deadline=None)
@given(small_scenarios())
def test_analysis_equals_brute_force(s: Scenario) -> None:
    brute = _brute(s)
    u_s, u_b = utilities(s)
    assert np.allclose(u_s, [b[1] for b in brute]) and np.allclose(u_b, [b[2] for b in brute])
    a = analyse(s)
    pts = {(round(x, 9), round(y, 9)) for _, x, y in brute}
    frontier = {p for p in pts if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in pts)}
    got = {(round(float(x), 9), round(float(y), 9)) for x, y in a.pareto_utilities}
    assert got == frontier
    assert len(a.pareto_indices) == len(frontier)
    rv_s, rv_b = s.seller.reservation, s.buyer.reservation
    zone = [(x, y) for _, x, y in brute if x >= rv_s and y >= rv_b]
    assert a.zopa == bool(zone)
    assert a.zopa_size == pytest.approx(len(zone) / len(brute))
    assert a.max_joint_utility == pytest.approx(max(x + y for _, x, y in brute))
    if zone:
        best = max((x - rv_s) * (y - rv_b) for x, y in zone)
        assert a.nash_product == pytest.approx(best)
        assert a.nash_index is not None
        x, y = u_s[a.nash_index], u_b[a.nash_index]
        assert x >= rv_s and y >= rv_b and (x - rv_s) * (y - rv_b) == pytest.approx(best)
    else:
        assert a.nash_index is None and a.nash_utilities is None


@settings(max_examples=40, deadline=None)
@given(small_scenarios(), st.data())
def test_offer_index_round_trip(s: Scenario, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, s.outcome_count - 1))
    offer = offer_at(s, k)
    assert index_of(s, offer) == k
    u_s, _ = utilities(s)
    assert u_s[k] == pytest.approx(s.seller.utility(offer, s.issues))


def test_index_order_is_row_major_and_off_grid_values_are_named(widget_scenario: Scenario) -> None:
    space = outcome_space(widget_scenario.issues)
    assert space.values_at(0) == {"price": 50, "quantity": 1, "warranty": "none"}
    assert space.values_at(1) == {"price": 50, "quantity": 1, "warranty": "1y"}
    with pytest.raises(ValueError, match="price=52"):
        space.index_of({"price": 52, "quantity": 1, "warranty": "none"})
    with pytest.raises(IndexError):
        space.values_at(space.size)


def test_utilities_are_cached_and_read_only(widget_scenario: Scenario) -> None:
    u1 = utilities(widget_scenario)
    assert utilities(widget_scenario)[0] is u1[0]
    with pytest.raises(ValueError):
        u1[0][0] = 0.5


def test_opposition_is_one_on_a_zero_sum_space_and_zero_when_interests_align() -> None:
    issues = (Issue("price", IssueKind.INT, low=0, high=10),)
    up, down = ValueFunction.increasing(), ValueFunction.decreasing()
    zero_sum = Scenario("z", "p", "c", issues, Preferences({"price": 1.0}, {"price": up}, 0.3),
                        Preferences({"price": 1.0}, {"price": down}, 0.3))  # fmt: skip
    aligned = Scenario("a", "p", "c", issues, Preferences({"price": 1.0}, {"price": up}, 0.3),
                       Preferences({"price": 1.0}, {"price": up}, 0.3))  # fmt: skip
    assert analyse(zero_sum).opposition == pytest.approx(1.0)
    assert analyse(zero_sum).nash_utilities == pytest.approx((0.5, 0.5))
    assert analyse(aligned).opposition == pytest.approx(0.0)
    assert analyse(aligned).pareto_size == 1
