"""The generator: deterministic, every category conforms, zones of agreement as promised, opposition knob works."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.scenarios.analysis import analyse, utilities
from nego.scenarios.catalog import CATEGORIES, category_names
from nego.scenarios.check import check_scenario
from nego.scenarios.generator import GeneratedId, generate_scenario, generate_scenarios, regenerate
from nego.scenarios.scenario import Role


def test_catalog_has_at_least_twelve_categories_of_both_segments() -> None:
    assert len(CATEGORIES) >= 12
    assert {c.segment for c in CATEGORIES} == {"B2B", "B2C"}


@pytest.mark.parametrize("name", category_names())
def test_every_category_conforms(name: str) -> None:
    for index in range(3):
        s = generate_scenario(5, index=index, category=name)
        check_scenario(s)
        assert 3 <= len(s.issues) <= 6 and s.outcome_count <= 200_000
        assert s.category == name and s.seller_brief and s.buyer_brief
        assert "{" not in s.product + s.context
    check_scenario(generate_scenario(5, category=name, zopa=False))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 1000), st.none() | st.floats(0, 1))
def test_generation_is_deterministic_and_has_a_zone_of_agreement(seed: int, index: int, opp: float | None) -> None:
    a = generate_scenario(seed, index=index, opposition=opp)
    b = generate_scenario(seed, index=index, opposition=opp)
    assert a == b and a.content_hash() == b.content_hash()
    assert a.zopa and analyse(a).zopa
    assert 0.0 <= a.seller.reservation <= 1.0 and 0.0 <= a.buyer.reservation <= 1.0
    assert regenerate(a.id) == a


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 100))
def test_no_zopa_scenarios_have_none_and_say_so(seed: int, index: int) -> None:
    s = generate_scenario(seed, index=index, zopa=False)
    assert not s.zopa and not analyse(s).zopa
    assert s.id.endswith("-nozopa") and regenerate(s.id) == s


def test_suite_members_equal_single_draws_and_ids_are_unique() -> None:
    suite = generate_scenarios(30, 9)
    assert [s.id for s in suite] == [f"{s.category}-9-{i}" for i, s in enumerate(suite)]
    assert suite[17] == generate_scenario(9, index=17)
    assert len({s.content_hash() for s in suite}) == 30
    assert generate_scenarios(5, 10) != generate_scenarios(5, 9)


def test_fixing_the_category_does_not_change_the_rest_of_the_stream() -> None:
    s = generate_scenario(4, index=2)
    assert generate_scenario(4, index=2, category=s.category) == s


def test_opposition_knob_moves_the_measured_opposition() -> None:
    low = [analyse(generate_scenario(1, index=i, opposition=0.0)).opposition for i in range(40)]
    high = [analyse(generate_scenario(1, index=i, opposition=1.0)).opposition for i in range(40)]
    assert np.mean(high) > np.mean(low) + 0.3
    assert np.mean(high) > 0.9


def test_generation_uses_no_global_random_state() -> None:
    np.random.seed(0)
    before = np.random.random()
    np.random.seed(0)
    generate_scenarios(3, 1)
    assert np.random.random() == before


def test_briefs_speak_for_their_own_side_only() -> None:
    s = generate_scenario(2, category="laptops")
    assert s.seller_brief.startswith("You are") and "selling" in s.seller_brief
    assert "buying" in s.buyer_brief
    assert f"{s.seller.reservation:.0%}" in s.seller_brief
    assert s.view_for(Role.SELLER).brief == s.seller_brief


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="opposition"):
        generate_scenario(1, opposition=1.5)
    with pytest.raises(ValueError, match="unknown category 'spaceships'"):
        generate_scenario(1, category="spaceships")
    with pytest.raises(ValueError, match="non-negative"):
        generate_scenario(-1)
    with pytest.raises(KeyError):
        regenerate("office-chairs")
    assert GeneratedId.parse("laptops-3-4-o0.25-nozopa") == GeneratedId("laptops", 3, 4, 0.25, False)


def test_utilities_in_unit_interval_over_whole_grids() -> None:
    for s in generate_scenarios(20, 3):
        u_s, u_b = utilities(s)
        assert u_s.min() >= 0 and u_s.max() <= 1 and u_b.min() >= 0 and u_b.max() <= 1


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.data())
def test_utilities_of_random_offers_lie_in_unit_interval(seed: int, data: st.DataObject) -> None:
    s = generate_scenario(seed)
    offer = {}
    for issue in s.issues:
        if issue.kind.value == "categorical":
            offer[issue.name] = data.draw(st.sampled_from(issue.options))
        elif issue.kind.value == "int":
            offer[issue.name] = data.draw(st.sampled_from(issue.grid()))
        else:  # float issues accept any value in range, not only grid points
            offer[issue.name] = data.draw(st.floats(issue.low, issue.high))
    for role in (Role.SELLER, Role.BUYER):
        assert 0.0 <= s.utility(role, offer) <= 1.0
