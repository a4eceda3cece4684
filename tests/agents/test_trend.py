"""The other side's trend (what it conceded, how its last offer moved) is told alike in the compact protocol and the
chat prompt, from the observation alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from nego.agents.compact.protocol import MOVES, CompactTrace
from nego.agents.llm.chat_layout import CHAT_TEMPLATE
from nego.agents.llm.prompts import DEFAULT_TEMPLATE, load_template
from nego.agents.trend import MOVE_NAMES, conceded, move_class, opponent_utilities, trend_sentence
from nego.market.types import ActionKind, Observation, Offer, PublicMove
from nego.scenarios.scenario import Role

from ..conftest import make_widget_scenario

utilities = st.lists(st.floats(0, 1, allow_nan=False), max_size=12)


@given(utilities)
def test_the_concession_is_never_negative_and_the_last_move_needs_two_offers(us):
    assert conceded(us) >= 0
    assert (move_class(us) is None) == (len(us) < 2)


@given(st.floats(0, 1), st.floats(-1, 1), st.floats(-1, 1))
def test_a_larger_last_move_is_never_a_smaller_class(start, a, b):
    low, high = sorted((a, b))
    assert move_class([start, start + low]) <= move_class([start, start + high])


def buyer_offers(prices: list[int]) -> tuple[PublicMove, ...]:
    ask = Offer({"price": 150, "quantity": 10, "warranty": "none"})
    moves = []
    for k, price in enumerate(prices, start=1):
        bid = Offer({"price": price, "quantity": 10, "warranty": "2y"})
        moves += [PublicMove(k, Role.SELLER, ActionKind.OFFER, ask), PublicMove(k, Role.BUYER, ActionKind.OFFER, bid)]
    return tuple(moves)


def test_compact_words_and_the_chat_line_say_the_same_moves():
    view = make_widget_scenario(max_rounds=8).view_for(Role.SELLER)
    prices = [60, 60, 100, 95]  # stalled, conceded a lot, took something back
    expected = ["stalled", "conceded a lot", "took something back"]
    trace = CompactTrace(Role.SELLER)
    chat, v2 = load_template(CHAT_TEMPLATE), load_template(DEFAULT_TEMPLATE)
    for n in range(1, len(prices) + 1):
        history = buyer_offers(prices[:n])
        obs = Observation(view, history, n + 1, history[-1].offer)
        trace.observe(obs)
        words = trace.words
        user = chat.render(obs, tools=False)[1].content
        assert "Since its first offer" not in v2.render(obs, tools=False)[1].content  # plain templates are unchanged
        us = opponent_utilities(history, view)
        assert words[-1].startswith("T") and f"c{round(conceded(us) * 20)}" in words[-4:]
        if n == 1:
            assert trend_sentence(history, view) == "" and "Since its first offer" not in user
            continue
        kind = move_class(us)
        assert MOVE_NAMES[kind] == expected[n - 2] and words[-2] == MOVES[kind]
        line = (
            f"Since its first offer the buyer has conceded {conceded(us):.2f} of your score; "
            f"with its last offer it {expected[n - 2]}"
        )
        assert line in user
        update = chat.render_update(Observation(view, history[:-2], n, history[-3].offer), obs, tools=False).content
        assert line in update and update.index(line) < update.index(f"Round {n + 1} of 8")
