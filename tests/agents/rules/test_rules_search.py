"""The meet-in-the-middle search gives the same answers as brute force over every outcome."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.rules.search import OutcomeSpace, split_issues
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.preferences import Preferences, ValueFunction


def space_for(seed: int, n_issues: int) -> tuple[OutcomeSpace, list[dict], np.ndarray]:
    rng = np.random.default_rng(seed)
    issues, values = [], {}
    for k in range(n_issues):
        name = f"i{k}"
        if rng.random() < 0.3:
            opts = tuple(f"o{j}" for j in range(int(rng.integers(2, 5))))
            issues.append(Issue(name, IssueKind.CATEGORICAL, options=opts))
            values[name] = ValueFunction.options({o: float(rng.random()) for o in opts})
        else:
            issues.append(Issue(name, IssueKind.INT, low=0, high=int(rng.integers(1, 7))))
            values[name] = ValueFunction.increasing() if rng.random() < 0.5 else ValueFunction.decreasing()
    w = rng.dirichlet(np.ones(n_issues))
    w = w / w.sum()
    prefs = Preferences({f"i{k}": float(w[k]) for k in range(n_issues)}, values, reservation=0.0)
    issues = tuple(issues)
    outcomes = [
        dict(zip([i.name for i in issues], v, strict=True)) for v in itertools.product(*(i.grid() for i in issues))
    ]
    utils = np.array([prefs.utility(o, issues) for o in outcomes])
    return OutcomeSpace(issues, prefs), outcomes, utils


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 100_000), n_issues=st.integers(1, 5), target=st.floats(-0.1, 1.1))
def test_at_least_equals_brute_force(seed, n_issues, target):
    space, outcomes, utils = space_for(seed, n_issues)
    assert space.size == len(outcomes)
    assert abs(space.best - utils.max()) < 1e-12 and abs(space.worst - utils.min()) < 1e-12
    idx = space.at_least(target)
    above = utils[utils >= target]
    if above.size == 0:
        assert idx is None
        return
    offer = space.offer(idx)
    prefs_u = utils[outcomes.index(dict(offer))]
    assert abs(prefs_u - above.min()) < 1e-12
    assert abs(space.utility(idx) - prefs_u) < 1e-12


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 100_000), floor=st.floats(0.0, 0.9))
def test_sampling_is_uniform_over_outcomes_above_the_floor(seed, floor):
    space, _outcomes, utils = space_for(seed, 3)
    rng = np.random.default_rng(seed)
    n_above = int((utils >= floor).sum())
    assert space.count_at_least(floor) == n_above
    draws = [space.sample_at_least(floor, rng) for _ in range(400)]
    if n_above == 0:
        assert all(d is None for d in draws)
        return
    assert all(space.utility(d) >= floor - 1e-12 for d in draws)
    if n_above <= 4:  # every eligible outcome shows up
        assert len({space.offer(d) for d in draws}) == n_above


def test_candidates_give_each_lefts_cheapest_partner():
    space, _outcomes, utils = space_for(7, 4)
    cand = space.candidates(0.5)
    assert np.all(cand.utility >= 0.5 - 1e-12)
    assert abs(cand.utility.min() - utils[utils >= 0.5].min()) < 1e-12


def test_split_balances_grid_products():
    left, right = split_issues([20, 10, 30, 25])
    prod = lambda g: int(np.prod([[20, 10, 30, 25][p] for p in g]))  # noqa: E731
    assert sorted(left + right) == [0, 1, 2, 3]
    assert max(prod(left), prod(right)) / min(prod(left), prod(right)) < 2


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 100_000), n_issues=st.integers(1, 5))
def test_table_utility_is_bit_identical_to_preferences(seed, n_issues):
    space, outcomes, utils = space_for(seed, n_issues)
    for o, u in zip(outcomes[:50], utils[:50], strict=False):
        assert space.utility_of(o) == u


def test_off_grid_values_fall_back_to_the_preferences():
    issues = (Issue("x", IssueKind.FLOAT, low=0.0, high=1.0, step=0.5), Issue("y", IssueKind.INT, low=0, high=2))
    prefs = Preferences({"x": 0.5, "y": 0.5}, {"x": ValueFunction.increasing(), "y": ValueFunction.decreasing()}, 0.0)
    space = OutcomeSpace(issues, prefs)
    assert space.utility_of({"x": 0.3, "y": 1}) == prefs.utility({"x": 0.3, "y": 1}, issues)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    n_issues=st.integers(1, 5),
    targets=st.lists(st.floats(-0.1, 1.1), min_size=1, max_size=12),
)
def test_at_least_many_answers_each_target_as_at_least_does(seed, n_issues, targets):
    space, _outcomes, _utils = space_for(seed, n_issues)
    assert space.at_least_many(targets) == [space.at_least(t) for t in targets]


def test_spaces_over_one_issues_tuple_share_their_offers():
    first, _outcomes, _utils = space_for(3, 4)
    rng = np.random.default_rng(0)
    other = Preferences(
        {name: float(w) for name, w in zip(first._layout.names, rng.dirichlet(np.ones(4)), strict=True)},
        {
            issue.name: ValueFunction.options({o: 0.5 for o in issue.options})
            if issue.options
            else ValueFunction.decreasing()
            for issue in first.issues
        },
        reservation=0.0,
    )
    second = OutcomeSpace(first.issues, other)
    index = (len(first._a) - 1, 0)
    assert second.offer(index) is first.offer(index)
    assert first.offer(index) is first.offer(index)
    # an equal but distinct issues tuple decodes the same values into offers of its own
    assert tuple(list(first.issues)) is not first.issues
    copy = OutcomeSpace(tuple(list(first.issues)), other)
    assert copy.offer(index) == first.offer(index) and copy.offer(index) is not first.offer(index)


def test_a_full_offer_table_starts_again_and_each_space_keeps_its_offers(monkeypatch):
    from nego.agents.rules import search

    monkeypatch.setattr(search._Layout, "MAX_OFFERS", 2)
    space, outcomes, _utils = space_for(11, 3)
    indices = [(i, j) for i in range(len(space._a)) for j in range(len(space._b))][:6]
    first = [space.offer(index) for index in indices]
    assert len(space._layout.offers) <= 2
    assert [space.offer(index) for index in indices] == first  # the space still hands out the same objects
    assert all(space.offer(index) is offer for index, offer in zip(indices, first, strict=True))
    assert all(dict(offer) in outcomes for offer in first)
    assert [space.offer_action(index).offer for index in indices] == first


def test_negotiators_of_one_scenario_share_one_space_and_others_get_their_own():
    from nego.agents.rules.search import shared_space

    space, _outcomes, _utils = space_for(5, 3)
    issues = space.issues
    prefs = Preferences(dict(zip(space._layout.names, (0.2, 0.3, 0.5), strict=True)), _values(issues), 0.1)
    one = shared_space(issues, prefs)
    assert shared_space(issues, prefs) is one
    equal = Preferences(dict(prefs.weights), dict(prefs.values), prefs.reservation)
    assert equal == prefs and shared_space(issues, equal) is not one  # kept by identity: an equal copy builds anew
    assert shared_space(tuple(issues), prefs) is one and shared_space(tuple(list(issues)), prefs) is not one


def test_what_a_space_remembers_of_the_offers_it_scored_stays_bounded(monkeypatch):
    from nego.agents.rules import search
    from nego.market.types import Offer

    monkeypatch.setattr(search, "_MAX_SEEN", 4)
    space, outcomes, utils = space_for(7, 3)
    for outcome, u in zip(outcomes[:20], utils[:20], strict=True):
        assert space.utility_of(Offer(outcome)) == u  # a fresh offer object each time, as a model's parse makes
        assert len(space._seen) <= 4


def _values(issues):
    return {
        issue.name: ValueFunction.options({o: 0.5 for o in issue.options})
        if issue.options
        else ValueFunction.increasing()
        for issue in issues
    }
