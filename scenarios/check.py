"""A conformance check that every built-in and generated scenario must pass (run over all of them in the tests)."""

from __future__ import annotations

import itertools
import json
from dataclasses import fields

import numpy as np

from .analysis import analyse, compute_utilities, outcome_space
from .files import dumps_toml, scenario_from_text
from .io import scenario_from_dict, scenario_to_dict
from .limits import MAX_ISSUE_POINTS, outcomes_problem, rounds_problem
from .scenario import Role, Scenario


class ScenarioCheckError(AssertionError):
    """A scenario broke one of the rules that simulations, analysis and files rely on."""


def check_scenario(scenario: Scenario) -> None:
    """Raise :class:`ScenarioCheckError` naming the first broken rule; return None when the scenario conforms."""
    _check_limits(scenario)
    _check_utilities(scenario)
    _check_isolation(scenario)
    _check_zopa_flag(scenario)
    _check_round_trips(scenario)


def _fail(scenario: Scenario, message: str) -> None:
    raise ScenarioCheckError(f"scenario {scenario.id!r}: {message}")


def _check_limits(scenario: Scenario) -> None:
    # The constructors enforce these; checking again catches a scenario altered past them (object.__setattr__).
    rounds = rounds_problem(scenario.max_rounds)
    if rounds is not None:
        _fail(scenario, f"max_rounds {rounds}")
    for issue in scenario.issues:
        if issue.size > MAX_ISSUE_POINTS:
            _fail(scenario, f"issue {issue.name!r} has {issue.size:,} grid points (limit {MAX_ISSUE_POINTS:,})")
    outcomes = outcomes_problem([i.size for i in scenario.issues])
    if outcomes is not None:
        _fail(scenario, outcomes)


def _check_utilities(scenario: Scenario) -> None:
    space = outcome_space(scenario.issues)
    u_s, u_b = compute_utilities(scenario)
    for role, u in ((Role.SELLER, u_s), (Role.BUYER, u_b)):
        if u.size != space.size or not np.all((u >= 0.0) & (u <= 1.0)):
            _fail(scenario, f"{role} utilities must lie in [0, 1] on all {space.size} outcomes")
    # Corners of the grid: the scalar utility (what agents use) must agree with the vectorised one (analysis).
    ends = [sorted({0, n - 1}) for n in space.shape]
    corners = list(itertools.product(*ends))[:256]
    for coords in corners:
        index = int(np.ravel_multi_index(coords, space.shape))
        offer = space.values_at(index)
        if space.index_of(offer) != index:
            _fail(scenario, f"outcome {index} does not map back to itself through its offer {offer}")
        for role, u in ((Role.SELLER, u_s), (Role.BUYER, u_b)):
            scalar = scenario.utility(role, offer)
            if not 0.0 <= scalar <= 1.0 or abs(scalar - u[index]) > 1e-9:
                _fail(scenario, f"{role} utility of {offer} is {scalar}, the grid says {u[index]}")


def _check_isolation(scenario: Scenario) -> None:
    for role in (Role.SELLER, Role.BUYER):
        view = scenario.view_for(role)
        other = role.other
        if view.role is not role or view.preferences is not scenario.preferences(role):
            _fail(scenario, f"the {role} view must carry the {role}'s own preferences")
        own_brief = scenario.seller_brief if role is Role.SELLER else scenario.buyer_brief
        other_brief = scenario.buyer_brief if role is Role.SELLER else scenario.seller_brief
        if view.brief != own_brief:
            _fail(scenario, f"the {role} view must carry the {role}'s own brief")
        for f in fields(view):
            value = getattr(view, f.name)
            if value is scenario.preferences(other) and scenario.preferences(other) is not scenario.preferences(role):
                _fail(scenario, f"the {role} view exposes the {other}'s preferences in field {f.name!r}")
            if isinstance(value, str) and other_brief and other_brief != own_brief and other_brief in value:
                _fail(scenario, f"the {role} view exposes the {other}'s brief in field {f.name!r}")


def _check_round_trips(scenario: Scenario) -> None:
    digest = scenario.content_hash()
    if scenario.content_hash() != digest:
        _fail(scenario, "content_hash() is not stable between calls")
    data = scenario_to_dict(scenario)
    copies = {
        "dict": scenario_from_dict(data),
        "TOML": scenario_from_text(dumps_toml(data), "toml", f"{scenario.id}.toml"),
        "JSON": scenario_from_text(json.dumps(data), "json", f"{scenario.id}.json"),
    }
    for how, copy in copies.items():
        if copy != scenario:
            _fail(scenario, f"a {how} round trip changed the scenario")
        if copy.content_hash() != digest:
            _fail(scenario, f"a {how} round trip changed the content hash")


def _check_zopa_flag(scenario: Scenario) -> None:
    has_zopa = analyse(scenario).zopa
    if has_zopa != scenario.zopa:
        said = "a zone of agreement" if scenario.zopa else "no zone of agreement"
        _fail(scenario, f"it says it has {said}, but the analysis finds {'one' if has_zopa else 'none'}")
