"""Scenarios and jobs cross process boundaries unchanged, and cheaply."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from nego.market.marketplace import Job
from nego.scenarios.generator import generate_scenario
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.scenario import Role


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_a_pickled_scenario_comes_back_equal_with_the_same_hash_and_types(draw):
    sc = generate_scenario(draw)
    back = pickle.loads(pickle.dumps(sc, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == sc and hash(back) == hash(sc)
    assert back.content_hash() == sc.content_hash()
    assert type(back.opener) is Role and all(type(i) is type(j) for i, j in zip(back.issues, sc.issues, strict=True))
    offer = {i.name: i.grid()[-1] for i in sc.issues}
    assert back.seller.utility(offer, back.issues) == sc.seller.utility(offer, sc.issues)
    assert copy.deepcopy(sc) == sc


def test_the_content_hash_travels_with_the_scenario_and_a_changed_copy_has_its_own():
    sc = generate_scenario(7)
    fresh = pickle.loads(pickle.dumps(sc))
    assert fresh._content_hash is None  # never asked for: nothing to carry
    expected = sc.content_hash()
    carried = pickle.loads(pickle.dumps(sc))
    assert carried._content_hash == expected  # computed once, where the scenario was made
    flipped = sc.with_opener(sc.opener.other)
    assert (
        flipped.content_hash() != expected
        and flipped.content_hash() == generate_scenario(7).with_opener(sc.opener.other).content_hash()
    )
    assert "_content_hash" not in repr(sc)


def test_a_pickled_job_comes_back_equal_with_its_id():
    job = Job(generate_scenario(3), "boulware", "tft", seed=11, day=2, pair=5)
    back = pickle.loads(pickle.dumps(job))
    assert back == job and back.negotiation_id == job.negotiation_id


@dataclass(frozen=True, slots=True)
class _Tagged(Issue):
    """An issue with a field of its own (module level, so that pickle finds it)."""

    label: str = ""


def test_a_subclass_with_a_field_of_its_own_pickles_as_itself():
    tagged = _Tagged("price", IssueKind.INT, low=1, high=5, label="x")
    back = pickle.loads(pickle.dumps(tagged))
    assert type(back) is _Tagged and back.label == "x" and back == tagged
    assert type(pickle.loads(pickle.dumps(Issue("price", IssueKind.INT, low=1, high=5)))) is Issue
