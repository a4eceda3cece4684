"""Conformance check for negotiators: what every agent behind a spec must do to take part in a market.

For each scenario, seed and role the agent under test plays against a copy of itself and against a reference
partner, through the real protocol. It must return well-formed actions, finish, act the same way for the same
seed, and act the same way when only the other side's private information changes (it sees nothing but its
own observation). Programmatic agents, rule-based (``kind == "rule"``) and plugin ones from other packages
(``kind == "plugin"``), must also never make an invalid move: unlike a language model they have no excuse. Rule-based
agents must in addition never offer or accept anything worth less than their reservation value; for a plugin agent
that is a strategy choice the metrics report (individual-rationality violations), not a conformance failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace

from nego.market.marketplace import NegotiatorFactory
from nego.market.protocol import Negotiator, run_negotiation
from nego.market.types import Action, ActionKind, EndReason, NegotiationResult, Observation
from nego.scenarios.preferences import Preferences
from nego.scenarios.scenario import Role, Scenario

from .registry import resolve

VALID_MOVES_KINDS = frozenset({"rule", "plugin"})
"""Kinds of agents that must never make an invalid move."""
RATIONAL_KINDS = frozenset({"rule"})
"""Kinds of agents that must never offer or accept below their reservation value."""


class ConformanceError(AssertionError):
    """A negotiator broke a rule of the conformance check; the message names the spec, scenario, seed and rule."""


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What a passing check exercised."""

    spec: str
    kind: str
    negotiations: int
    turns: int
    agreements: int


def default_check_scenarios() -> list[Scenario]:
    """Generated scenarios covering both openers, short and long deadlines, and a scenario without a ZOPA."""
    from nego.scenarios.generator import generate_scenario

    return [
        generate_scenario(0, max_rounds=10),
        generate_scenario(1, max_rounds=6, opener=Role.BUYER),
        generate_scenario(2, max_rounds=4, zopa=False),
    ]


class _Replay:
    """Plays back a recorded list of actions (the other side of an earlier negotiation)."""

    def __init__(self, actions: Sequence[Action]) -> None:
        self._actions = list(actions)

    async def act(self, obs: Observation) -> Action:
        return self._actions.pop(0) if self._actions else Action.walk_away()


def _blinded(scenario: Scenario, role: Role) -> Scenario:
    """The scenario with the other side's private preferences and brief replaced."""
    other = role.other
    prefs = scenario.preferences(other)
    n = len(scenario.issues)
    changed = Preferences(
        {i.name: 1.0 / n for i in scenario.issues}, prefs.values, reservation=round(1.0 - prefs.reservation, 3)
    )
    brief = "CONFORMANCE-CANARY: private to the other side"
    if other is Role.SELLER:
        return replace(scenario, seller=changed, seller_brief=brief)
    return replace(scenario, buyer=changed, buyer_brief=brief)


async def _play(scenario: Scenario, role: Role, me: Negotiator, other: Negotiator, seed: int, timeout_s: float):
    seller, buyer = (me, other) if role is Role.SELLER else (other, me)
    return await asyncio.wait_for(run_negotiation(scenario, seller, buyer, seed=seed), timeout_s)


def _own_actions(result: NegotiationResult, role: Role) -> list[Action]:
    return [t.action for t in result.turns if t.role is role]


def _check_turns(
    result: NegotiationResult, scenario: Scenario, role: Role, valid_moves: bool, rational: bool, where: str
) -> None:
    if result.outcome.end_reason is EndReason.ERROR:
        raise ConformanceError(f"{where}: the negotiation ended with an error: {result.outcome.error}")
    standing = None
    rv = scenario.preferences(role).reservation
    for turn in result.turns:
        action = turn.action
        if turn.role is not role:
            if turn.valid and action.kind is ActionKind.OFFER:
                standing = action.offer
            continue
        if not isinstance(action, Action):
            raise ConformanceError(f"{where}: act() returned {type(action).__name__}, not an Action")
        if valid_moves and not turn.valid:
            raise ConformanceError(f"{where}: invalid move in round {turn.round}: {turn.feedback}")
        if not (rational and turn.valid):
            continue
        if action.kind is ActionKind.OFFER and scenario.utility(role, action.offer) < rv:
            raise ConformanceError(f"{where}: offered {action.offer.describe()} below its reservation value {rv}")
        if action.kind is ActionKind.ACCEPT and scenario.utility(role, standing) < rv:
            raise ConformanceError(f"{where}: accepted {standing.describe()} below its reservation value {rv}")


async def acheck_negotiator(
    factory_or_spec: NegotiatorFactory | str,
    scenarios: Sequence[Scenario] | None = None,
    seeds: Sequence[int] = (0, 1),
    partner: str = "linear",
    timeout_s: float = 60.0,
) -> CheckReport:
    """Async form of :func:`check_negotiator`, for callers already inside an event loop."""
    factory = resolve(factory_or_spec) if isinstance(factory_or_spec, str) else factory_or_spec
    ref = resolve(partner)
    valid_moves, rational = factory.kind in VALID_MOVES_KINDS, factory.kind in RATIONAL_KINDS
    scenarios = list(scenarios) if scenarios is not None else default_check_scenarios()
    negotiations = turns = agreements = 0
    for scenario in scenarios:
        for seed in seeds:
            for role in (Role.SELLER, Role.BUYER):
                where = f"{factory.spec} as {role} on {scenario.id} (seed {seed})"
                results = []
                for label, other in (("itself", factory), (partner, ref)):
                    first = await _play(
                        scenario, role, factory(role, seed), other(role.other, seed + 1), seed, timeout_s
                    )
                    _check_turns(first, scenario, role, valid_moves, rational, f"{where} vs {label}")
                    again = await _play(
                        scenario, role, factory(role, seed), other(role.other, seed + 1), seed, timeout_s
                    )
                    if _own_actions(again, role) != _own_actions(first, role):
                        raise ConformanceError(f"{where} vs {label}: different actions on a rerun with the same seed")
                    results.append(first)
                replay = _Replay(_own_actions(results[1], role.other))
                blind = await _play(_blinded(scenario, role), role, factory(role, seed), replay, seed, timeout_s)
                if _own_actions(blind, role) != _own_actions(results[1], role):
                    raise ConformanceError(
                        f"{where}: actions changed when only the other side's private preferences changed"
                    )
                negotiations += 5
                turns += sum(len(r.turns) for r in results)
                agreements += sum(r.outcome.agreed for r in results)
    return CheckReport(factory.spec, factory.kind, negotiations, turns, agreements)


def check_negotiator(
    factory_or_spec: NegotiatorFactory | str,
    scenarios: Sequence[Scenario] | None = None,
    seeds: Sequence[int] = (0, 1),
    partner: str = "linear",
    timeout_s: float = 60.0,
) -> CheckReport:
    """Run the conformance check (see the module docstring); raise :class:`ConformanceError` on the first
    violation, return a :class:`CheckReport` if everything passed. Not callable from a running event loop: use
    :func:`acheck_negotiator` there."""
    return asyncio.run(acheck_negotiator(factory_or_spec, scenarios, seeds, partner, timeout_s))
