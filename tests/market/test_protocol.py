"""The alternating-offers protocol: turn order, acceptance, invalid actions, deadlines, isolation."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from nego.market.protocol import ProtocolConfig, run_negotiation
from nego.market.types import Action, ActionKind, EndReason, Observation
from nego.scenarios.scenario import Role

from ..conftest import make_widget_scenario


class Scripted:
    """Plays a fixed list of actions and remembers every observation it received."""

    def __init__(self, actions):
        self.actions = list(actions)
        self.seen: list[Observation] = []

    async def act(self, obs: Observation) -> Action:
        self.seen.append(obs)
        return self.actions.pop(0)


OFFER_S = {"price": 150, "quantity": 10, "warranty": "none"}
OFFER_B = {"price": 60, "quantity": 10, "warranty": "2y"}


async def test_accept_ends_with_agreement_on_standing_offer(widget_scenario):
    seller = Scripted([Action.make_offer(OFFER_S)])
    buyer = Scripted([Action.accept()])
    r = await run_negotiation(widget_scenario, seller, buyer)
    assert r.outcome.end_reason is EndReason.AGREEMENT
    assert r.outcome.agreement == OFFER_S
    assert r.outcome.seller_utility == widget_scenario.utility(Role.SELLER, OFFER_S)
    assert buyer.seen[0].standing_offer == OFFER_S


async def test_invalid_actions_get_feedback_then_forfeit(widget_scenario):
    bad = Action.make_offer({"price": 1000, "quantity": 10, "warranty": "none"})
    seller = Scripted([Action.accept(), bad, Action.make_offer({"price": 150}), Action.walk_away()])
    buyer = Scripted([Action.accept()] * 3 + [Action.make_offer(OFFER_B)])
    r = await run_negotiation(widget_scenario, seller, buyer, config=ProtocolConfig(max_retries=2))
    fb = [o.feedback for o in seller.seen]
    assert fb[0] is None and [o.attempt for o in seller.seen] == [0, 1, 2, 0]  # three tries, forfeit, next turn
    assert "no offer" in fb[1]
    assert "price must be between 50 and 150" in fb[2]
    seller_turns = [t for t in r.turns if t.role is Role.SELLER]
    assert [t.valid for t in seller_turns[:3]] == [False, False, False]
    assert "missing value(s) for quantity, warranty" in seller_turns[2].feedback
    assert r.outcome.invalid_seller == 3 and r.outcome.forfeits_seller == 1
    # after the forfeit nothing is on the table, so the buyer's accept is invalid as well
    assert buyer.seen[0].standing_offer is None


async def test_deadline_without_agreement_gives_reservations():
    sc = make_widget_scenario(max_rounds=2)
    seller = Scripted([Action.make_offer(OFFER_S)] * 2)
    buyer = Scripted([Action.make_offer(OFFER_B)] * 2)
    r = await run_negotiation(sc, seller, buyer)
    assert r.outcome.end_reason is EndReason.DEADLINE
    assert r.outcome.seller_utility == sc.seller.reservation
    assert [t.role for t in r.turns] == [Role.SELLER, Role.BUYER] * 2


async def test_walk_away_and_backend_error(widget_scenario):
    r = await run_negotiation(widget_scenario, Scripted([Action.walk_away()]), Scripted([]))
    assert r.outcome.end_reason is EndReason.WALK_AWAY and r.outcome.ended_by is Role.SELLER

    class Broken:
        async def act(self, obs):
            raise ConnectionError("backend down")

    r = await run_negotiation(widget_scenario, Scripted([Action.make_offer(OFFER_S)]), Broken())
    assert r.outcome.end_reason is EndReason.ERROR and "backend down" in r.outcome.error


async def test_private_brief_never_reaches_the_other_side():
    sc = make_widget_scenario(seller_brief="CANARY-SELLER-7731", buyer_brief="CANARY-BUYER-1187")
    seller = Scripted([Action.make_offer(OFFER_S, "hello")] * 6)
    buyer = Scripted([Action.make_offer(OFFER_B)] * 6)
    await run_negotiation(sc, seller, buyer)
    assert all("CANARY-SELLER" not in repr(o) for o in buyer.seen)
    assert all("CANARY-BUYER" not in repr(o) for o in seller.seen)
    assert all(o.scenario.preferences == sc.buyer for o in buyer.seen)
    assert buyer.seen[0].history[0].kind is ActionKind.OFFER


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=120), st.integers(1, 60))
async def test_the_other_side_sees_a_long_message_cut_and_the_transcript_keeps_it_whole(message, cap):
    sc = make_widget_scenario(max_rounds=1)
    seller = Scripted([Action.make_offer(OFFER_S, message)])
    buyer = Scripted([Action.walk_away()])
    r = await run_negotiation(sc, seller, buyer, config=ProtocolConfig(max_message_chars=cap))
    shown = buyer.seen[0].history[0].message
    assert r.turns[0].action.message == message
    if len(message) <= cap:
        assert shown == message
    else:
        assert shown.startswith(message[:cap]) and f"[{len(message) - cap} more characters not shown]" in shown
        assert len(shown) < cap + 50


def test_offers_known_valid_skip_the_check_only_for_their_issues():
    """An offer built from validated grids is taken for those issues as it is; for another issues tuple, or built
    as a plain offer, its values are checked."""
    from nego.market.protocol import check_offer
    from nego.market.types import Offer

    sc = make_widget_scenario()
    values = {issue.name: issue.grid()[0] for issue in sc.issues}
    good = Offer.known_valid(dict(values), sc.issues)
    assert check_offer(sc, good) == (good, None)
    name = sc.issues[0].name
    bad_values = {**values, name: "not a value"}
    assert check_offer(sc, Offer(bad_values))[1] is not None
    other = dataclasses.replace(sc, issues=tuple(list(sc.issues)))
    assert other.issues is not sc.issues
    assert check_offer(other, Offer.known_valid(dict(bad_values), sc.issues))[1] is not None
    checked = Offer(values)
    assert check_offer(sc, checked) == (checked, None)
    assert check_offer(sc, checked) == (checked, None)
