"""The compact protocol: any generated scenario is expressible, words and actions round-trip, bad output is invalid."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.compact.protocol import (
    EOT,
    action_words,
    header_words,
    level_offer,
    offer_levels,
    parse_action,
    vocabulary,
)
from nego.market.types import Action, ActionKind
from nego.scenarios.generator import generate_scenario
from nego.scenarios.scenario import Role


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
def test_any_generated_offer_round_trips_through_levels(seed, data):
    view = generate_scenario(seed).view_for(Role.SELLER)
    offer = {i.name: data.draw(st.sampled_from(i.grid())) for i in view.issues}
    words = action_words(view, Action.make_offer(offer))
    assert set(words) <= set(vocabulary()) and words[-1] == EOT
    assert len(header_words(view)) == len(view.issues) + 2
    played = parse_action(view, words)
    assert played.kind is ActionKind.OFFER
    assert action_words(view, played) == words  # the played offer has the same own-value levels
    assert offer_levels(view, level_offer(view, [10] * len(view.issues))) == [10] * len(view.issues)


def test_malformed_turns_are_invalid_never_repaired(widget_scenario):
    view = widget_scenario.view_for(Role.SELLER)
    for words in (["offer", "L3", EOT], ["offer", "L3", "L4", "L5"], ["accept", "accept", EOT], ["L11", EOT], []):
        a = parse_action(view, words)
        assert a.kind is ActionKind.INVALID and a.error
    assert parse_action(view, ["accept", EOT]).kind is ActionKind.ACCEPT
    assert parse_action(view, ["walk", EOT]).kind is ActionKind.WALK_AWAY


def test_the_seller_sees_its_own_utility_of_both_offers_and_whether_it_clears_its_reservation(widget_scenario):
    import asyncio

    from nego.agents.compact.protocol import ABOVE, BELOW, OPP
    from nego.agents.registry import resolve
    from nego.market.protocol import run_negotiation
    from nego.training.sft import RecordingSeller

    seller = RecordingSeller(resolve("linear")(Role.SELLER, 0))
    result = asyncio.run(run_negotiation(widget_scenario, seller, resolve("boulware")(Role.BUYER, 0), seed=0))
    view = widget_scenario.view_for(Role.SELLER)
    words, n = seller.trace.words, len(view.issues)
    seen = [t for t in result.turns if t.action.offer is not None][: words.count(OPP) + words.count(EOT)]
    opp_words = [words[j + n + 1 : j + n + 3] for j, w in enumerate(words) if w == OPP]
    buyer_offers = [t.action.offer for t in seen if t.role is Role.BUYER]
    assert len(opp_words) == len(buyer_offers) >= 2
    for (u_word, side), offer in zip(opp_words, buyer_offers, strict=False):
        u = widget_scenario.utility(Role.SELLER, offer)
        assert u_word == f"u{round(u * 20)}" and side == (ABOVE if u >= view.preferences.reservation else BELOW)
    own = [words[j + 1] for j, w in enumerate(words[:-1]) if w == EOT and words[j + 1].startswith("u")]
    own_offers = [t.action.offer for t in result.turns if t.role is Role.SELLER and t.action.offer is not None]
    assert own and own == [f"u{round(widget_scenario.utility(Role.SELLER, o) * 20)}" for o in own_offers[: len(own)]]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data(), role=st.sampled_from([Role.SELLER, Role.BUYER]))
def test_a_level_plays_the_grid_value_nearest_its_own_value_first_on_ties(seed, data, role):
    view = generate_scenario(seed).view_for(role)
    levels = [data.draw(st.integers(0, 10)) for _ in view.issues]
    offer = level_offer(view, levels)
    for issue, level in zip(view.issues, levels, strict=True):
        vf = view.preferences.values[issue.name]
        distances = [abs(vf(issue, v) - level / 10) for v in issue.grid()]
        assert offer[issue.name] == issue.grid()[distances.index(min(distances))]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), aim=st.integers(0, 100), role=st.sampled_from([Role.SELLER, Role.BUYER]))
def test_an_aim_plays_the_cheapest_outcome_reaching_it_never_below_the_reservation(seed, aim, role):
    import itertools

    from nego.agents.compact.protocol import aim_offer

    view = generate_scenario(seed).view_for(role)
    played = parse_action(view, ["offer", f"a{aim}", EOT])
    assert played.kind is ActionKind.OFFER and played.offer == aim_offer(view, aim)
    rv = view.preferences.reservation
    grids = [i.grid() for i in view.issues]
    if len(list(itertools.islice(itertools.product(*grids), 20_001))) > 20_000:
        return  # brute force only where it is cheap
    names = [i.name for i in view.issues]
    utils = [view.utility(dict(zip(names, vs, strict=True))) for vs in itertools.product(*grids)]
    reaching = [u for u in utils if u >= max(aim / 100 - 1e-9, rv + 1e-9)]  # the rule sellers' tolerances
    u = view.utility(played.offer)
    if reaching:
        assert abs(u - min(reaching)) < 1e-9
    else:
        assert abs(u - max(utils)) < 1e-9  # nothing clears both: the best outcome


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
def test_an_offer_written_as_an_aim_plays_within_a_step_of_its_own_utility(seed, data):
    view = generate_scenario(seed).view_for(Role.SELLER)
    offer = {i.name: data.draw(st.sampled_from(i.grid())) for i in view.issues}
    u = view.utility(offer)
    words = action_words(view, Action.make_offer(offer), aims=True)
    assert words[0] == "offer" and words[-1] == EOT and set(words) <= set(vocabulary(aims=True))
    assert words[1] not in vocabulary()  # aim words exist only in an aims vocabulary
    played = parse_action(view, words)
    assert played.kind is ActionKind.OFFER
    aim = int(words[1][1:]) / 100
    assert abs(aim - u) <= 0.005 + 1e-9
    if u > view.preferences.reservation + 0.005:
        # the cheapest outcome reaching the aim: at least the aim, and no dearer than the offer itself when the aim
        # rounded down to it
        assert view.utility(played.offer) >= aim - 1e-9
        if aim <= u:
            assert view.utility(played.offer) <= u + 1e-9


def test_aim_words_out_of_range_or_mixed_with_levels_are_invalid(widget_scenario):
    view = widget_scenario.view_for(Role.SELLER)
    for words in (["offer", "a101", EOT], ["offer", "a", EOT], ["offer", "a5", "L3", EOT], ["offer", "a-1", EOT]):
        assert parse_action(view, words).kind is ActionKind.INVALID
