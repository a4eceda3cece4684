"""Preferences.scorer and pair_scorer are faster utilities: they must give exactly the same floats."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nego.scenarios.analysis import offer_at
from nego.scenarios.generator import generate_scenario
from nego.scenarios.issues import IssueKind
from nego.scenarios.preferences import pair_scorer
from nego.scenarios.scenario import Role


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), pick=st.integers(0, 10**9))
def test_scorer_equals_utility_bit_for_bit(seed, pick):
    sc = generate_scenario(seed)
    offer = offer_at(sc, pick % sc.outcome_count)
    for role in Role:
        prefs = sc.preferences(role)
        assert prefs.scorer(sc.issues)(offer) == prefs.utility(offer, sc.issues)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), pick=st.integers(0, 10**9), shares=st.lists(st.floats(0, 1), min_size=8))
def test_off_grid_values_score_as_utility_does(seed, pick, shares):
    """Values between grid points (any legal float, an int given as a float) take the computed path."""
    sc = generate_scenario(seed)
    values = dict(offer_at(sc, pick % sc.outcome_count))
    for issue, share in zip(sc.issues, shares, strict=False):
        if issue.kind is IssueKind.FLOAT:
            values[issue.name] = issue.low + share * (issue.high - issue.low)
        elif issue.kind is IssueKind.INT:
            values[issue.name] = float(values[issue.name])
    for role in Role:
        prefs = sc.preferences(role)
        assert prefs.scorer(sc.issues)(values) == prefs.utility(values, sc.issues)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), pick=st.integers(0, 10**9))
def test_pair_scorer_equals_both_utilities(seed, pick):
    sc = generate_scenario(seed)
    offer = offer_at(sc, pick % sc.outcome_count)
    both = pair_scorer(sc.seller, sc.buyer, sc.issues)(offer)
    assert both == (sc.seller.utility(offer, sc.issues), sc.buyer.utility(offer, sc.issues))
