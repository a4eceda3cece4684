"""Repair examples for a chat model's warm start: some of a rule seller's offers are shown first as an invalid reply,
the kind a small model writes (an offer that leaves issues out, a number outside its range or off its grid, an option
that is not one), followed by the protocol's own feedback on it and then the rule's valid reply.

Played rule negotiations hold no invalid reply, so a model cloned on them alone never sees feedback and what follows
it; played, it then repeats a wrong reply on every retry. A repaired negotiation is the same negotiation with the
invalid attempt inserted before the move it stands for: the move keeps its round and becomes the turn's next attempt,
and the feedback is what :func:`~nego.market.protocol.judge` says of the invalid reply as the parser reads it, so the
conversation is the one the model would be played in had it written that reply. The invalid reply is context (the
warm start masks it out of the loss); the correction after the feedback is what the model learns.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
from nego.agents.llm.backends.base import ChatResponse
from nego.agents.llm.parsing import action_to_json, parse_response
from nego.market.protocol import judge
from nego.market.types import ActionKind, NegotiationResult, Offer, Turn
from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.scenario import Role, Scenario

WORDS = ("standard", "premium", "dessert", "monthly", "yes", "maybe", "negotiable", "blue", "other", "none of these")
"""Made-up options for a categorical issue (any that happens to be a real option is skipped)."""


def corrupt_offer(body: dict[str, Any], issues: tuple[Issue, ...], rng: np.random.Generator) -> dict[str, Any] | None:
    """A copy of the offer action ``body`` (its JSON form) with one mistake, drawn among those that apply: some issues
    left out (the last ones, or any), a number outside its range or off its grid, or an option that is not one.
    None when no mistake applies."""
    offer = dict(body["offer"])
    numeric = [i for i in issues if i.kind is not IssueKind.CATEGORICAL]
    categorical = [i for i in issues if i.kind is IssueKind.CATEGORICAL]
    kinds = ["missing"] if len(issues) > 1 else []
    kinds += ["range"] * bool(numeric) + ["option"] * bool(categorical)
    gridded = [i for i in numeric if i.kind is IssueKind.INT and i.step > 1]
    kinds += ["grid"] * bool(gridded)
    if not kinds:
        return None
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "missing":
        k = 1 + int(rng.integers(len(issues) - 1))
        names = [i.name for i in issues]
        dropped = names[-k:] if rng.random() < 0.5 else list(rng.choice(names, size=k, replace=False))
        offer = {n: v for n, v in offer.items() if n not in dropped}
    elif kind == "range":
        issue = numeric[int(rng.integers(len(numeric)))]
        offer[issue.name] = _out_of_range(issue, rng)
    elif kind == "grid":
        issue = gridded[int(rng.integers(len(gridded)))]
        offer[issue.name] = int(offer[issue.name]) + 1 if offer[issue.name] < issue.high else issue.high - 1
    else:
        issue = categorical[int(rng.integers(len(categorical)))]
        made_up = [w for w in WORDS if w not in issue.options]
        offer[issue.name] = made_up[int(rng.integers(len(made_up)))]
    return {**body, "offer": offer}


def _out_of_range(issue: Issue, rng: np.random.Generator) -> int | float:
    span = issue.high - issue.low
    if rng.random() < 0.5:  # far above: digits too many, as small models write them
        value = issue.high * int(rng.integers(10, 200)) + int(rng.integers(1, 10))
    elif issue.low > 0 and rng.random() < 0.5:
        value = issue.low - max(1, int(span * rng.uniform(0.1, 1.0)))
    else:
        value = issue.high + max(1, int(span * rng.uniform(0.1, 1.0)))
    return int(value) if issue.kind is IssueKind.INT else float(value)


def with_repairs(
    scenario: Scenario,
    result: NegotiationResult,
    rate: float,
    rng: np.random.Generator,
    *,
    prompt_id: str = "",
    role: Role = Role.SELLER,
    line: bool = True,
) -> NegotiationResult:
    """``result`` with each of ``role``'s valid first-attempt offers preceded, with probability ``rate``, by an invalid
    attempt (:func:`corrupt_offer`) that the parser and the protocol judge as they would in play; the offer then
    becomes that turn's second attempt. ``line``: the invalid reply is one line of JSON without a message (the reply
    format of a template using ``reply_line``), else the fenced JSON block with the message."""
    if not 0 <= rate <= 1:
        raise ValueError(f"the repair rate must be in [0, 1], got {rate}")
    issues = scenario.issues
    standing: Offer | None = None
    standing_by: Role | None = None
    turns: list[Turn] = []
    for turn in result.turns:
        if turn.role is role and turn.valid and turn.attempt == 0 and turn.action.kind is ActionKind.OFFER:
            invalid = _invalid_turn(scenario, turn, issues, rng, rate, standing, standing_by, prompt_id, line)
            if invalid is not None:
                turns.append(replace(invalid, index=len(turns)))
                turn = replace(turn, attempt=1)
        turns.append(replace(turn, index=len(turns)))
        if turn.valid and turn.action.kind is ActionKind.OFFER:
            standing, standing_by = turn.action.offer, turn.role
    return replace(result, turns=tuple(turns))


def _invalid_turn(
    scenario: Scenario,
    turn: Turn,
    issues: tuple[Issue, ...],
    rng: np.random.Generator,
    rate: float,
    standing: Offer | None,
    standing_by: Role | None,
    prompt_id: str,
    line: bool,
) -> Turn | None:
    if rng.random() >= rate:
        return None
    body = action_to_json(turn.action)
    wrong = corrupt_offer(body, issues, rng)
    if wrong is None:
        return None
    if line:
        wrong.pop("message", None)
        text = json.dumps(wrong)
    else:
        text = "```json\n" + json.dumps(wrong) + "\n```"
    action = parse_response(ChatResponse(text), issues, prompt_id=prompt_id)
    feedback, action = judge(scenario, action, standing, standing_by, turn.role)
    if feedback is None:  # the mistake happens to be legal (it never should): no repair for this move
        return None
    return Turn(turn.index, turn.round, turn.role, 0, action, False, feedback)
