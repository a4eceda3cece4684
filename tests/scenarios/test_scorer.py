"""Preferences.scorer is a faster utility: it must give exactly the same floats."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nego.scenarios.analysis import offer_at
from nego.scenarios.generator import generate_scenario
from nego.scenarios.scenario import Role


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), pick=st.integers(0, 10**9))
def test_scorer_equals_utility_bit_for_bit(seed, pick):
    sc = generate_scenario(seed)
    offer = offer_at(sc, pick % sc.outcome_count)
    for role in Role:
        prefs = sc.preferences(role)
        assert prefs.scorer(sc.issues)(offer) == prefs.utility(offer, sc.issues)
