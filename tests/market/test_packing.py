"""Packed results: what crosses to a worker's parent is exactly the result that was played."""

from __future__ import annotations

import pickle
from dataclasses import fields

from hypothesis import given
from hypothesis import strategies as st
from nego.agents.registry import resolve
from nego.market.marketplace import Job, Marketplace, error_result
from nego.market.packing import pack_result, unpack_result
from nego.market.types import Action, EndReason, NegotiationResult, Offer, Outcome, Turn, Usage

from ..conftest import make_widget_scenario
from .fakes import BrokenFactory, Factory

PACKED_FIELDS = {
    NegotiationResult: ("scenario_id", "seed", "outcome", "turns", "usage_seller", "usage_buyer"),
    Outcome: (
        "end_reason",
        "agreement",
        "seller_utility",
        "buyer_utility",
        "rounds",
        "turns",
        "ended_by",
        "invalid_seller",
        "invalid_buyer",
        "forfeits_seller",
        "forfeits_buyer",
        "error",
    ),
    Turn: ("index", "round", "role", "attempt", "action", "valid", "feedback", "utility_seller", "utility_buyer"),
    Action: ("kind", "offer", "message", "raw", "error", "usage"),
    Usage: ("prompt_tokens", "completion_tokens", "latency_s", "cost_usd", "calls"),
}


def test_the_packer_knows_every_field_of_what_it_packs():
    for cls, names in PACKED_FIELDS.items():
        assert tuple(f.name for f in fields(cls)) == names, f"{cls.__name__} changed: update nego.market.packing"


async def test_packed_results_unpack_to_equal_results_through_pickle():
    sc = make_widget_scenario(max_rounds=4)
    specs = {
        "a": Factory("a", invalid_first=True, tokens=5),
        "b": Factory("b"),
        "broken": BrokenFactory(),
        "hardliner": resolve("hardliner"),
        "walker": resolve("walker"),
    }
    pairs = [("a", "b"), ("hardliner", "hardliner"), ("hardliner", "walker"), ("broken", "b")]
    jobs = [Job(sc, s, b, seed=i) for i in range(4) for s, b in pairs]
    results = await Marketplace(specs).run(jobs)
    results.append(error_result(jobs[0], "could not build agents: boom"))
    reasons = {r.outcome.end_reason for r in results}
    assert len(reasons) == 4  # deals, walk-aways, deadlines and errors
    assert any(t.action.usage is not None for r in results for t in r.turns)
    assert any(not t.valid for r in results for t in r.turns)
    for result in results:
        back = unpack_result(pickle.loads(pickle.dumps(pack_result(result))))
        assert back == result
        assert [type(t.role) for t in back.turns] == [type(t.role) for t in result.turns]


async def test_an_offer_repeated_across_turns_crosses_once_and_comes_back_as_one_offer():
    sc = make_widget_scenario(max_rounds=6)
    [result] = await Marketplace({"hardliner": resolve("hardliner")}).run([Job(sc, "hardliner", "hardliner", seed=0)])
    sellers = [t.action.offer for t in result.turns if t.role == "seller" and t.action.offer is not None]
    assert len(sellers) > 1 and all(o is sellers[0] for o in sellers)  # a hardliner repeats one offer object
    packed = pack_result(result)
    offers = [turn[4][1] for turn in packed[3] if turn[2] == "seller" and turn[4][1] is not None]
    assert all(o is offers[0] for o in offers)  # one (values, text) pair, which pickle stores once
    back = unpack_result(pickle.loads(pickle.dumps(packed)))
    assert back == result
    again = [t.action.offer for t in back.turns if t.role == "seller" and t.action.offer is not None]
    assert all(o is again[0] for o in again)
    assert again[0].to_json() == sellers[0].to_json() == '{"price":150,"quantity":10,"warranty":"none"}'


values = st.one_of(
    st.integers(-(10**12), 10**12), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8), st.booleans()
)


@given(st.dictionaries(st.text(min_size=1, max_size=6), values, min_size=1, max_size=5))
def test_an_unpacked_offer_writes_the_text_its_original_writes(offer_values):
    offer = Offer(offer_values)
    outcome = Outcome(EndReason.AGREEMENT, offer, 0.5, 0.5, 1, 1)
    back = unpack_result(pickle.loads(pickle.dumps(pack_result(NegotiationResult("s", 0, outcome, ())))))
    agreed = back.outcome.agreement
    assert agreed == offer and hash(agreed) == hash(offer)
    assert agreed.to_json() == offer.to_json() == Offer(dict(agreed)).to_json()
