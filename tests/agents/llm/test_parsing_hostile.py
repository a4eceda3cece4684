"""The action parser on hostile replies: it never raises, refuses nesting bombs, huge numbers and broken unicode
with feedback a model can act on, and still finds the action in replies with stray braces and quotes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.llm.backends.base import ChatResponse, ToolCall
from nego.agents.llm.json_scan import (
    MAX_DEPTH,
    JSONLimitError,
    OversizedNumber,
    loads_bounded,
    nesting_depth,
    scan_objects,
)
from nego.agents.llm.parsing import (
    MAX_FEEDBACK_CHARS,
    TEXT_ACTIONS,
    action_blocks,
    parse_response,
    parse_text,
    read_envelope,
)
from nego.market.types import Action, ActionKind

from ...conftest import make_widget_scenario

ISSUES = make_widget_scenario().issues
OFFER = {"action": "offer", "offer": {"price": 120, "quantity": 4, "warranty": "1y"}, "message": "hi"}
GOOD = [json.dumps(OFFER), '{"action": "accept", "message": "deal"}', '{"action": "walk_away"}']
TOOLS = ["make_offer", "accept", "walk_away", "haggle"]

BOMBS = {
    "nested objects": '{"a":' * 10_000 + "1" + "}" * 10_000,
    "nested arrays": '{"action": "offer", "offer": ' + "[" * 10_000 + "]" * 10_000 + "}",
    "unclosed nesting": '{"a":' * 10_000,
    "open braces": "{" * 50_000,
    "huge integer": json.dumps(OFFER).replace("120", "9" * 10_000),
    "huge negative integer": json.dumps(OFFER).replace("120", "-" + "7" * 10_000),
    "lone surrogate": '{"action": "accept", "message": "\\ud800 and \\udfff"}',
    "raw lone surrogate": '{"action": "accept", "message": "\ud800"}',
    "unhashable action": '{"action": ["offer"]}',
    "object action": '{"action": {"offer": 1}}',
    "control characters": '{"action": "accept", "message": "a\x00b"}',
}


def _check_total(action: Action) -> None:
    """What every parse must give: an Action whose stored texts can be written as UTF-8, and feedback if invalid."""
    assert isinstance(action, Action)
    for text in (action.message, action.raw, action.error):
        text.encode("utf-8")  # a lone surrogate here would break the Parquet writer
    if action.kind is ActionKind.INVALID:
        assert action.error and len(action.error) < MAX_FEEDBACK_CHARS + 100


@st.composite
def mutated_replies(draw) -> str:
    """A well-formed action block with a few edits: inserted structure, cuts, copies, bombs, odd characters."""
    text = draw(st.sampled_from(GOOD))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.integers(0, 6))
        if op == 0:
            text = text[:at] + draw(st.sampled_from(list('{}[]":,\\\n'))) + text[at:]
        elif op == 1:
            text = text[:at] + text[at + draw(st.integers(1, 6)) :]
        elif op == 2:
            depth = draw(st.sampled_from([MAX_DEPTH, 1_000, 10_000]))
            text = text[:at] + '{"a":' * depth + text[at:] + "}" * draw(st.sampled_from([0, depth]))
        elif op == 3:
            depth = draw(st.sampled_from([MAX_DEPTH + 1, 2_000]))
            text = text[:at] + "[" * depth + "1" + "]" * depth + text[at:]
        elif op == 4:
            text = text.replace("120", draw(st.sampled_from(["9" * 5_000, "-" + "9" * 10_000, "1e999999"])))
        elif op == 5:
            text = (
                text[:at] + draw(st.sampled_from(["\\ud800", "\ud800", "\x00", "\u2028", "é", "\\u0000"])) + text[at:]
            )
        else:
            text = text[:at] + text[at : at + draw(st.integers(1, 30))] * draw(st.integers(1, 3)) + text[at:]
    return text


@settings(max_examples=400, deadline=None)
@given(mutated_replies(), st.booleans(), st.sampled_from(TOOLS))
def test_any_mutated_reply_parses_to_an_action_without_raising(text, as_tool, tool):
    response = ChatResponse("", (ToolCall(tool, text),)) if as_tool else ChatResponse(text)
    action = parse_response(response, ISSUES, prompt_id="p:1")
    _check_total(action)
    assert read_envelope(action.raw)["prompt"] == "p:1"


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text(max_size=200), st.booleans())
def test_any_text_and_any_tool_arguments_parse_without_raising(text, arguments, truncated):
    _check_total(parse_response(ChatResponse(text, truncated=truncated), ISSUES))
    _check_total(parse_response(ChatResponse(text, (ToolCall("make_offer", arguments),)), ISSUES))
    _check_total(parse_text(text, ISSUES))


@pytest.mark.parametrize("name", sorted(BOMBS))
@pytest.mark.parametrize("as_tool", [False, True])
def test_hostile_replies_are_actions_not_exceptions(name, as_tool):
    text = BOMBS[name]
    response = ChatResponse("", (ToolCall("make_offer", text),)) if as_tool else ChatResponse(text)
    action = parse_response(response, ISSUES)
    _check_total(action)
    if name in ("lone surrogate", "raw lone surrogate") and not as_tool:
        return  # a legal accept whose message is stored with U+FFFD, checked below
    assert action.kind is ActionKind.INVALID


def test_nesting_bombs_get_feedback_that_says_what_was_wrong():
    deep = parse_response(ChatResponse('{"a":' * 5_000 + "1" + "}" * 5_000), ISSUES)
    assert f"a JSON object nested 5000 levels deep was ignored (at most {MAX_DEPTH} are read)" in deep.error
    tool = parse_response(ChatResponse("", (ToolCall("make_offer", "[" * 10_000),)), ISSUES)
    assert (
        tool.error == f"no usable tool call: the arguments of make_offer are nested more than {MAX_DEPTH} levels deep"
    )
    cut = parse_response(ChatResponse('Here: {"action": "offer", "offer": {"price": 1' + "0" * 50), ISSUES)
    assert "no action found: the JSON object that starts at character 6 is never closed" in cut.error
    assert parse_response(ChatResponse("{" * 50_000), ISSUES).error.startswith("no action found: reply with one")


def test_huge_numbers_are_out_of_range_and_shown_by_their_length():
    action = parse_response(ChatResponse(BOMBS["huge integer"]), ISSUES)
    assert "price must be between 50 and 150" in action.error and "a number of 10000 digits" in action.error
    assert "9999" not in action.error
    tool = parse_response(ChatResponse("", (ToolCall("make_offer", '{"price": ' + "1" * 5_000 + "}"),)), ISSUES)
    assert "a number of 5000 digits" in tool.error and "missing value(s) for quantity, warranty" in tool.error
    assert parse_response(
        ChatResponse("", (ToolCall("accept", '{"message": ' + "1" * 5_000 + "}"),)), ISSUES
    ).error == ('"message" must be a string, got a number')


def test_lone_surrogates_are_stored_as_replacement_characters():
    action = parse_response(ChatResponse(BOMBS["lone surrogate"]), ISSUES)
    assert action.kind is ActionKind.ACCEPT and action.message == "\ufffd and \ufffd"
    raw = parse_response(ChatResponse(BOMBS["raw lone surrogate"]), ISSUES)
    assert raw.kind is ActionKind.ACCEPT and "\ufffd" in read_envelope(raw.raw)["text"]


def test_long_feedback_is_cut():
    offer = {"price": "x" * 20_000, "quantity": 4, "warranty": "1y"}
    action = parse_text(json.dumps({"action": "offer", "offer": offer}), ISSUES)
    assert action.kind is ActionKind.INVALID and action.error.startswith("price must be a number")
    assert action.error.endswith(f"(feedback cut at {MAX_FEEDBACK_CHARS} characters)")


def test_an_unknown_action_name_is_named_in_the_feedback():
    action = parse_text('{"action": "counter", "offer": {"price": 100}}', ISSUES)
    assert "\"action\" must be one of offer, accept, walk_away; got 'counter'" in action.error


FRAGMENTS = [
    *'{}[]":,\\\n 1x',
    "true",
    "-2.5e3",
    "it's",
    "```json\n",
    "{not json}",
    '{"a": ',
    '"b"',
    '"action"',
    '"action": "accept"',
    '{"action": "accept"}',
    '{"action":"walk_away","message":"b}y{e"}',
    '{"action": "offer", "offer": {"price": 100}}',
    '{"action": "counter"}',
    '{"x": [{"action": "accept"}]}',
]


def restart_at_every_brace(text: str) -> list[dict]:
    """The obvious quadratic reading: try a JSON decoder at every "{", skip past an action block, else go on
    at the next brace (so objects inside non-action objects are found too)."""
    decoder, found = json.JSONDecoder(), []
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("action"), str) and obj["action"] in TEXT_ACTIONS:
            found.append(obj)
            pos = text.find("{", end)
        else:
            pos = text.find("{", pos + 1)
    return found


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=16).map("".join))
def test_the_one_pass_scan_finds_what_a_decoder_restarted_at_every_brace_finds(text):
    assert list(action_blocks(text)) == restart_at_every_brace(text)


@pytest.mark.parametrize(
    "text",
    [
        'I would say {maybe\n```json\n{"action": "accept"}\n```',  # a brace that never closes
        'My "best {offer\n{"action": "accept"}',  # a quote that never closes on its line
        'Prices {like this} and "quotes" then {"action": "accept"} and a stray }',
        '{"a": [1, 2}\n{"action": "accept"}',  # a mismatched bracket
        '[{"note": "x"}, {"action": "accept"}]',  # wrapped in other JSON
        '{"action": "walk_away"} then {"action": "accept"}',  # the last block wins
        '{"action": "accept", "message": "{not a block}"} trailing {',
    ],
)
def test_the_action_is_found_around_stray_braces_and_quotes(text):
    action = parse_text(text, ISSUES)
    assert action.kind is ActionKind.ACCEPT, action.error


def test_action_blocks_are_not_looked_into_but_other_objects_are():
    text = '{"wrapper": {"action": "offer", "offer": {"action": "accept"}}} '
    text += '{"action": "walk_away", "x": {"action": "accept"}}'
    assert [b["action"] for b in action_blocks(text)] == ["offer", "walk_away"]


def test_bounded_json_reading():
    assert nesting_depth('{"a": "[[[[", "b": [[1]]}') == 3
    assert nesting_depth("[" * 100) == MAX_DEPTH + 1  # counting stops past the limit
    assert loads_bounded("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(JSONLimitError):
        loads_bounded("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    huge = loads_bounded("-" + "3" * 500)
    assert isinstance(huge, OversizedNumber) and huge == float("-inf") and repr(huge) == "a number of 500 digits"
    assert loads_bounded("1" * 100) == int("1" * 100)
    scan = scan_objects('{"x": 1} ' + "[" * 50 + '{"y": 2}' + "]" * 50 + ' {"z": {"w": ' + "[" * 40 + "]" * 40 + "}}")
    assert scan.objects == ({"x": 1}, {"y": 2}) and scan.too_deep == 42 and scan.unclosed_at is None
