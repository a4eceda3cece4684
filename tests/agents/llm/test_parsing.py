"""The action parser: accepted formats round-trip, the last block wins, bad input is invalid with a reason."""

from __future__ import annotations

import json

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from nego.agents.llm.backends.base import ChatResponse, ToolCall
from nego.agents.llm.parsing import (
    action_blocks,
    action_to_json,
    action_to_tool_call,
    action_tools,
    parse_response,
    parse_text,
    read_envelope,
)
from nego.market.types import Action, ActionKind, Usage
from nego.scenarios.issues import Issue, IssueKind

ISSUES = (
    Issue("price", IssueKind.INT, low=50, high=150, step=5, unit="USD"),
    Issue("quantity", IssueKind.INT, low=1, high=10, unit="units"),
    Issue("warranty", IssueKind.CATEGORICAL, options=("none", "1y", "2y")),
    Issue("discount", IssueKind.FLOAT, low=0.0, high=0.3, unit="fraction"),
)


@st.composite
def actions(draw) -> Action:
    message = draw(st.text(max_size=40))
    kind = draw(st.sampled_from([ActionKind.OFFER, ActionKind.ACCEPT, ActionKind.WALK_AWAY]))
    if kind is not ActionKind.OFFER:
        return Action(kind, message=message)
    offer = {
        "price": draw(st.sampled_from(ISSUES[0].grid())),
        "quantity": draw(st.integers(1, 10)),
        "warranty": draw(st.sampled_from(ISSUES[2].options)),
        "discount": draw(st.floats(0.0, 0.3, allow_nan=False)),
    }
    return Action.make_offer(offer, message)


def _serialise(action: Action, fmt: str, before: str, after: str) -> ChatResponse:
    if fmt == "tool":
        return ChatResponse(before + after, (action_to_tool_call(action),))
    block = json.dumps(action_to_json(action), ensure_ascii=fmt == "fenced-ascii")
    if fmt.startswith("fenced"):
        block = f"```json\n{block}\n```"
    return ChatResponse(f"{before}\n{block}\n{after}")


def _same(a: Action, b: Action) -> bool:
    return (a.kind, a.offer, a.message) == (b.kind, b.offer, b.message)


@settings(max_examples=150, deadline=None)
@given(actions(), st.sampled_from(["tool", "fenced", "fenced-ascii", "bare"]), st.text(max_size=60), st.text())
def test_any_valid_action_in_any_format_round_trips(action, fmt, before, after):
    assume(not list(action_blocks(before)) and not list(action_blocks(after)))
    parsed = parse_response(_serialise(action, fmt, before, after), ISSUES, prompt_id="p:1")
    assert parsed.kind is not ActionKind.INVALID, parsed.error
    assert _same(parsed, action)
    assert read_envelope(parsed.raw)["prompt"] == "p:1"


def _escape_some(text: str, mask: list[bool]) -> str:
    return "".join(f"\\u{ord(c):04x}" if m else c for c, m in zip(text, mask, strict=True))


@settings(max_examples=100, deadline=None)
@given(actions(), st.lists(st.booleans(), min_size=6, max_size=6), st.text(max_size=30))
def test_an_action_key_spelled_with_json_escapes_is_still_read(action, mask, before):
    assume(not list(action_blocks(before)))
    block = json.dumps(action_to_json(action)).replace('"action"', '"' + _escape_some("action", mask) + '"', 1)
    parsed = parse_response(ChatResponse(f"{before} {block}"), ISSUES)
    assert parsed.kind is not ActionKind.INVALID, parsed.error
    assert _same(parsed, action)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_prose_never_parses_to_an_action(text):
    assume("{" not in text)
    parsed = parse_text(text, ISSUES)
    assert parsed.kind is ActionKind.INVALID and "no action found" in parsed.error


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["price", "quantity", "warranty", "discount", "colour"]), _json_values))
def test_arbitrary_json_offers_parse_only_when_every_value_is_legal(offer):
    text = json.dumps({"action": "offer", "offer": offer})
    parsed = parse_text(text, ISSUES)
    legal = set(offer) == {i.name for i in ISSUES}
    for issue in ISSUES:
        if issue.name in offer:
            try:
                issue.validate(offer[issue.name])
            except ValueError:
                legal = False
    assert (parsed.kind is ActionKind.OFFER) == legal
    if not legal:
        assert parsed.error


def test_numbers_in_prose_are_never_guessed():
    parsed = parse_text("I offer price 120 USD, quantity 5, warranty 1y, discount 0.1.", ISSUES)
    assert parsed.kind is ActionKind.INVALID


def test_last_well_formed_block_wins_and_malformed_ones_are_skipped():
    text = (
        '{"action": "offer", "offer": {"price": 100}}\n'
        "on second thought:\n"
        '```json\n{"action": "accept", "message": "deal"}\n```\n'
        '{"action": "offer", "offer": {"price": 1'  # truncated: not a block
    )
    parsed = parse_text(text, ISSUES)
    assert parsed.kind is ActionKind.ACCEPT and parsed.message == "deal"


def test_last_block_is_final_even_when_it_is_illegal():
    good = {"price": 100, "quantity": 2, "warranty": "1y", "discount": 0.1}
    text = json.dumps({"action": "offer", "offer": good}) + json.dumps(
        {"action": "offer", "offer": {**good, "price": 200}}
    )
    parsed = parse_text(text, ISSUES)
    assert parsed.kind is ActionKind.INVALID and "price must be between 50 and 150" in parsed.error


def test_precise_reasons_for_bad_offers():
    bad = {"price": "120", "quantity": 2.5, "warranty": "3y", "colour": "red"}
    err = parse_text(json.dumps({"action": "offer", "offer": bad}), ISSUES).error
    assert "unknown issue(s) 'colour'" in err and "missing value(s) for discount" in err
    assert "price must be a number" in err and "quantity must be a whole number" in err
    assert "warranty must be one of none, 1y, 2y" in err
    assert "takes no" in parse_text('{"action": "accept", "offer": {"price": 50}}', ISSUES).error
    assert "must be a string" in parse_text('{"action": "walk_away", "message": 3}', ISSUES).error
    assert parse_text('{"action": "offer", "offer": {"price": 55, "quantity": true, "warranty": "1y", '
                      '"discount": 0}}', ISSUES).kind is ActionKind.INVALID  # fmt: skip


def test_tool_calls_take_precedence_and_the_last_well_formed_call_wins():
    offer = {"price": 55, "quantity": 3, "warranty": "2y", "discount": 0.0}
    calls = (
        ToolCall("make_offer", json.dumps(offer)),
        ToolCall("accept", "{}"),
        ToolCall("make_offer", '{"price": 5'),  # truncated arguments: not well formed
        ToolCall("haggle", "{}"),
    )
    r = parse_response(ChatResponse('{"action": "walk_away"}', calls, Usage(calls=1)), ISSUES)
    assert r.kind is ActionKind.ACCEPT and r.usage == Usage(calls=1)
    env = read_envelope(r.raw)
    assert env["text"] == '{"action": "walk_away"}' and len(env["tool_calls"]) == 4


def test_unusable_tool_calls_fall_back_to_text_or_say_why():
    calls = (ToolCall("make_offer", "[1, 2]"),)
    assert parse_response(ChatResponse('{"action": "walk_away"}', calls), ISSUES).kind is ActionKind.WALK_AWAY
    r = parse_response(ChatResponse("", calls), ISSUES)
    assert r.kind is ActionKind.INVALID and "must be a JSON object" in r.error
    r = parse_response(ChatResponse("", (ToolCall("make_offer", '{"price": 60}'),)), ISSUES)
    assert "missing value(s) for quantity, warranty, discount" in r.error


def test_action_tools_describe_every_issue():
    offer, accept, walk = action_tools(ISSUES)
    props = offer.parameters["properties"]
    assert offer.parameters["required"] == ["price", "quantity", "warranty", "discount"]
    assert props["price"] == {
        "type": "integer",
        "minimum": 50,
        "maximum": 150,
        "description": ISSUES[0].describe(),
    }
    assert props["warranty"]["enum"] == ["none", "1y", "2y"] and props["discount"]["type"] == "number"
    assert (accept.name, walk.name) == ("accept", "walk_away")
    assert offer.openai()["function"]["name"] == "make_offer" and "input_schema" in walk.anthropic()
