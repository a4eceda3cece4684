"""From a model's reply to a checked :class:`Action`: the action tools, the accepted formats, the parser.

A reply is read in this order and nothing else is tried:

1. tool calls (``make_offer``, ``accept``, ``walk_away``): the LAST well-formed call wins (a known tool name
   and arguments that are a JSON object);
2. otherwise the reply text: every top-level JSON object in it (fenced in a ```json block or bare) that has an
   ``"action"`` of ``"offer"``, ``"accept"`` or ``"walk_away"``; the LAST such block wins.

The chosen action is then checked against the scenario's issues (types, ranges, completeness). Numbers are
never guessed from prose: anything that is not one of these shapes becomes ``Action.invalid`` with a reason
precise enough to be sent back to the model as feedback.

Reading is bounded (see :mod:`nego.agents.llm.json_scan`): the text is scanned once, in time linear in its length
(the first 50,000 characters), JSON nested deeper than 32 levels is refused, integers over 100 digits are read
as out of range, lone surrogates are stored as U+FFFD and feedback is cut at 2,000 characters. So every reply,
however hostile, gives an :class:`Action`: the parser never raises.

``Action.raw`` records what the model produced as a JSON envelope (see :func:`raw_envelope`):
``{"prompt": "<template id>", "text": "...", "tool_calls": [{"name": ..., "arguments": ...}]}``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nego.market.protocol import check_values
from nego.market.types import Action, ActionKind, Offer
from nego.scenarios.issues import Issue, IssueKind

from .backends.base import ACTION_TOOLS, TOOL_ACCEPT, TOOL_OFFER, TOOL_WALK_AWAY, ChatResponse, ToolCall, ToolSpec
from .json_scan import MAX_DEPTH, JSONLimitError, loads_bounded, scan_objects

TEXT_ACTIONS = {"offer": ActionKind.OFFER, "accept": ActionKind.ACCEPT, "walk_away": ActionKind.WALK_AWAY}
TRUNCATED_HINT = "write a shorter reply that ends with the action"
_MAX_SCAN_CHARS = 50_000  # a reply longer than this is cut before scanning: bounded work on hostile input
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_FEEDBACK_CHARS = 2_000
"""Feedback longer than this is cut: it goes back into the next prompt and into the transcript."""

_MESSAGE_SCHEMA = {"type": "string", "description": "A short message shown to the other side."}


def issue_schema(issue: Issue) -> dict[str, Any]:
    """JSON Schema of one issue's value, with its range and unit in the description."""
    if issue.kind is IssueKind.CATEGORICAL:
        return {"type": "string", "enum": list(issue.options), "description": issue.describe()}
    kind = "integer" if issue.kind is IssueKind.INT else "number"
    return {"type": kind, "minimum": issue.low, "maximum": issue.high, "description": issue.describe()}


def action_tools(issues: Iterable[Issue]) -> tuple[ToolSpec, ...]:
    """The three action tools for a scenario: ``make_offer`` (one required property per issue, plus an
    optional ``message``), ``accept`` and ``walk_away`` (an optional ``message`` each)."""
    return _action_tools(tuple(issues))


@functools.lru_cache(maxsize=256)  # built once per issue set, not once per model call
def _action_tools(issues: tuple[Issue, ...]) -> tuple[ToolSpec, ...]:
    offer_props: dict[str, Any] = {i.name: issue_schema(i) for i in issues}
    offer_props["message"] = _MESSAGE_SCHEMA
    msg_only = {"type": "object", "properties": {"message": _MESSAGE_SCHEMA}, "required": []}
    return (
        ToolSpec(
            TOOL_OFFER,
            "Propose a complete deal: a value for every issue.",
            {"type": "object", "properties": offer_props, "required": [i.name for i in issues]},
        ),
        ToolSpec(TOOL_ACCEPT, "Accept the other side's standing offer as it is.", msg_only),
        ToolSpec(TOOL_WALK_AWAY, "End the negotiation without a deal.", msg_only),
    )


def action_to_json(action: Action) -> dict[str, Any]:
    """The plain-text JSON form of a valid action, as the prompts ask models to write it."""
    if action.kind is ActionKind.INVALID:
        raise ValueError("an invalid action has no JSON form")
    d: dict[str, Any] = {"action": action.kind.value}
    if action.kind is ActionKind.OFFER:
        d["offer"] = action.offer.to_dict()
    d["message"] = action.message
    return d


def action_to_tool_call(action: Action) -> ToolCall:
    """The tool-call form of a valid action (what a well-behaved model sends when offered the tools)."""
    if action.kind is ActionKind.INVALID:
        raise ValueError("an invalid action has no tool-call form")
    name = {ActionKind.OFFER: TOOL_OFFER, ActionKind.ACCEPT: TOOL_ACCEPT, ActionKind.WALK_AWAY: TOOL_WALK_AWAY}
    args: dict[str, Any] = dict(action.offer.to_dict()) if action.kind is ActionKind.OFFER else {}
    args["message"] = action.message
    return ToolCall(name[action.kind], json.dumps(args))


def raw_envelope(prompt_id: str, response: ChatResponse) -> str:
    """What gets stored in ``Action.raw``: the prompt id, the reply text and the raw tool calls, as JSON
    (lone surrogates, which no UTF-8 file can hold, replaced by U+FFFD)."""
    calls = [{"name": clean_text(c.name), "arguments": clean_text(c.arguments)} for c in response.tool_calls]
    envelope = {"prompt": prompt_id, "text": clean_text(response.text), "tool_calls": calls}
    return json.dumps(envelope, ensure_ascii=False)


def read_envelope(raw: str) -> dict[str, Any]:
    """Inverse of :func:`raw_envelope` (raises ValueError on anything else)."""
    d = json.loads(raw)
    if not isinstance(d, dict) or not {"prompt", "text", "tool_calls"} <= set(d):
        raise ValueError("not a raw reply envelope")
    return d


def parse_response(response: ChatResponse, issues: tuple[Issue, ...], *, prompt_id: str = "") -> Action:
    """Turn a model reply into a checked action (``raw`` and ``usage`` filled in), or an invalid one saying why.

    Total: any text and any tool-call arguments give an :class:`Action`, never an exception."""
    raw = raw_envelope(prompt_id, response)
    action, error = _from_tool_calls(response.tool_calls, issues)
    if action is None:
        scan = scan_actions(response.text)
        if error is None or scan.blocks:  # no tool calls, or none usable while the text holds an action block
            action, error = _from_scan(scan, issues)
    if action is None:
        error = error or "no action found"
        if response.truncated:  # say why, or the model is told only that its (cut) reply held no action
            error += f"; your reply was cut off at the length limit: {TRUNCATED_HINT}"
        return Action.invalid(raw, _feedback(error), usage=response.usage)
    return Action(action.kind, action.offer, action.message, raw=raw, usage=response.usage)


def parse_text(text: str, issues: tuple[Issue, ...]) -> Action:
    """Parse a plain-text reply (no tool calls); ``raw`` is the text itself. Total, like :func:`parse_response`."""
    action, error = _from_scan(scan_actions(text), issues)
    if action is None:
        return Action.invalid(clean_text(text), _feedback(error or "no action found"))
    return Action(action.kind, action.offer, action.message, raw=clean_text(text))


def _from_tool_calls(calls: tuple[ToolCall, ...], issues: tuple[Issue, ...]) -> tuple[Action | None, str | None]:
    """(action, None), (None, reason) or (None, None) when there are no tool calls at all."""
    if not calls:
        return None, None
    problems = []
    for call in reversed(calls):
        if call.name not in ACTION_TOOLS:
            problems.append(f"unknown tool {_short(call.name)!r}; the tools are {', '.join(ACTION_TOOLS)}")
            continue
        try:
            args = loads_bounded(call.arguments) if call.arguments.strip() else {}
        except JSONLimitError as e:
            problems.append(f"the arguments of {call.name} are {e}")
            continue
        except json.JSONDecodeError as e:
            problems.append(f"the arguments of {call.name} are not valid JSON ({e.msg} at char {e.pos})")
            continue
        if not isinstance(args, dict):
            problems.append(f"the arguments of {call.name} must be a JSON object, got {json_type(args)}")
            continue
        message = args.pop("message", "")
        if call.name == TOOL_OFFER:
            return _checked(ActionKind.OFFER, args, message, issues)
        kind = ActionKind.ACCEPT if call.name == TOOL_ACCEPT else ActionKind.WALK_AWAY
        return _checked(kind, None, message, issues)
    return None, "no usable tool call: " + "; ".join(reversed(problems))


@dataclass(frozen=True, slots=True)
class TextScan:
    """The action blocks found in a reply's text, in order, and notes on what looked like one but was not."""

    blocks: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()


def scan_actions(text: str) -> TextScan:
    """Every top-level JSON object in ``text`` whose ``"action"`` is a known action name, in order.

    Objects that are not action blocks are looked into (an action may be wrapped in other JSON); action
    blocks are not (their own inner objects are never separate actions). Linear in the length of the text
    (which is cut at 50,000 characters); nesting deeper than 32 levels is refused, with a note saying so.
    """
    found = scan_objects(text[:_MAX_SCAN_CHARS], needle='"action"')
    blocks: list[dict[str, Any]] = []
    unknown: list[Any] = []
    for obj in found.objects:
        _collect_actions(obj, blocks, unknown)
    notes = []
    if unknown:
        notes.append(f'"action" must be one of {", ".join(TEXT_ACTIONS)}; got {_short(repr(unknown[-1]))}')
    if found.too_deep:
        notes.append(f"a JSON object nested {found.too_deep} levels deep was ignored (at most {MAX_DEPTH} are read)")
    if found.unclosed_at is not None:
        notes.append(f"the JSON object that starts at character {found.unclosed_at} is never closed")
    if len(text) > _MAX_SCAN_CHARS:
        notes.append(f"only the first {_MAX_SCAN_CHARS} characters of your reply were read")
    return TextScan(tuple(blocks), tuple(notes))


def _collect_actions(value: Any, blocks: list[dict[str, Any]], unknown: list[Any]) -> None:
    """Append the action blocks in ``value`` (a decoded JSON value, at most 32 deep) in document order."""
    if isinstance(value, list):
        for item in value:
            _collect_actions(item, blocks, unknown)
        return
    if not isinstance(value, dict):
        return
    name = value.get("action")
    if isinstance(name, str) and name in TEXT_ACTIONS:
        blocks.append(value)
        return
    if "action" in value and not isinstance(name, dict | list):
        unknown.append(name)
    for item in value.values():
        _collect_actions(item, blocks, unknown)


def action_blocks(text: str) -> Iterable[dict[str, Any]]:
    """The action blocks of :func:`scan_actions`, in order."""
    return scan_actions(text).blocks


def _from_scan(scan: TextScan, issues: tuple[Issue, ...]) -> tuple[Action | None, str]:
    if not scan.blocks:
        notes = "".join(f"{note}; " for note in scan.notes)
        return None, (
            f"no action found: {notes}reply with one JSON object such as "
            '{"action": "offer", "offer": {...}, "message": "..."}, {"action": "accept"} or {"action": "walk_away"}'
        )
    block = scan.blocks[-1]
    kind = TEXT_ACTIONS[block["action"]]
    message = block.get("message", "")
    if kind is ActionKind.OFFER:
        offer = block.get("offer")
        if not isinstance(offer, dict):
            return None, f'an "offer" action needs "offer": an object with a value for every issue; got {offer!r}'
        return _checked(kind, offer, message, issues)
    if "offer" in block:
        return None, f'"{block["action"]}" takes no "offer"; to propose terms use "action": "offer"'
    return _checked(kind, None, message, issues)


def _checked(
    kind: ActionKind, offer: Mapping[str, Any] | None, message: Any, issues: tuple[Issue, ...]
) -> tuple[Action | None, str | None]:
    if not isinstance(message, str):
        return None, f'"message" must be a string, got {json_type(message)}'
    message = clean_text(message)
    if kind is not ActionKind.OFFER:
        return Action(kind, message=message), None
    checked, error = check_offer_values(offer or {}, issues)
    if checked is None:
        return None, error
    return Action.make_offer(checked, message), None


def check_offer_values(values: Mapping[str, Any], issues: tuple[Issue, ...]) -> tuple[Offer | None, str | None]:
    """(normalised offer, None) or (None, every problem found): the protocol's own check, so a model is told
    exactly what the protocol would tell it."""
    return check_values(values, issues)


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate (a JSON ``"\\ud800"`` escape decodes to one) replaced by U+FFFD, so it
    can be written as UTF-8; any other text is returned as it is."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, as a model would understand it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    names = {str: "a string", list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _feedback(error: str) -> str:
    error = clean_text(error)
    if len(error) <= MAX_FEEDBACK_CHARS:
        return error
    return f"{error[:MAX_FEEDBACK_CHARS]}... (feedback cut at {MAX_FEEDBACK_CHARS} characters)"
