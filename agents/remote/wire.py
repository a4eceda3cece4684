"""The JSON wire format of remote agents: observations and actions as plain, versioned dicts.

The marketplace sends a remote agent the :class:`Observation` of the side it plays (which only ever holds
that side's own view: its preferences, its brief, the public history) and gets an :class:`Action` back.
Both directions cross a trust boundary, so the ``*_from_dict`` functions validate every field and raise
:class:`WireError` naming the path of the first bad field (``observation.scenario.issues[1].low: ...``). An
observation is held to the limits of scenario files (:mod:`nego.scenarios.limits`: grid points per issue, outcomes,
rounds), so no body can make an agent enumerate an unbounded grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nego.market.types import Action, ActionKind, Observation, Offer, PublicMove, Usage
from nego.scenarios.io import issue_to_dict, preferences_to_dict
from nego.scenarios.issues import Issue, IssueKind, Value
from nego.scenarios.limits import is_finite_number, outcomes_problem, rounds_problem
from nego.scenarios.preferences import Direction, Preferences, ValueFunction
from nego.scenarios.scenario import Role, ScenarioView

WIRE_VERSION = 1
"""Bumped on any incompatible change; a body with another version is refused, never guessed at."""

_MOVE_KINDS = (ActionKind.OFFER, ActionKind.ACCEPT, ActionKind.WALK_AWAY)
_USAGE_INT_FIELDS = ("prompt_tokens", "completion_tokens", "calls")
_USAGE_FLOAT_FIELDS = ("latency_s", "cost_usd")


class WireError(ValueError):
    """An incoming body does not follow the wire format; the message names the bad field and why."""


# ----------------------------------------------------------------------------------------------- encoding


def offer_to_dict(offer: Offer | None) -> dict[str, Value] | None:
    return None if offer is None else offer.to_dict()


def usage_to_dict(usage: Usage) -> dict[str, Any]:
    return {f: getattr(usage, f) for f in (*_USAGE_INT_FIELDS, *_USAGE_FLOAT_FIELDS)}


def view_to_dict(view: ScenarioView) -> dict[str, Any]:
    return {
        "id": view.id,
        "role": view.role.value,
        "product": view.product,
        "context": view.context,
        "issues": [issue_to_dict(i) for i in view.issues],
        "preferences": preferences_to_dict(view.preferences, view.issues),
        "brief": view.brief,
        "max_rounds": view.max_rounds,
        "opener": view.opener.value,
    }


def observation_to_dict(obs: Observation) -> dict[str, Any]:
    """The whole observation as JSON-ready data (the receiving side's own view and the public history)."""
    return {
        "v": WIRE_VERSION,
        "scenario": view_to_dict(obs.scenario),
        "history": [
            {
                "round": m.round,
                "role": m.role.value,
                "kind": m.kind.value,
                "offer": offer_to_dict(m.offer),
                "message": m.message,
            }
            for m in obs.history
        ],
        "round": obs.round,
        "standing_offer": offer_to_dict(obs.standing_offer),
        "feedback": obs.feedback,
        "attempt": obs.attempt,
    }


def action_to_dict(action: Action) -> dict[str, Any]:
    return {
        "v": WIRE_VERSION,
        "kind": action.kind.value,
        "offer": offer_to_dict(action.offer),
        "message": action.message,
        "raw": action.raw,
        "error": action.error,
        "usage": None if action.usage is None else usage_to_dict(action.usage),
    }


# ----------------------------------------------------------------------------------------------- decoding


def _get(d: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in d:
        raise WireError(f"{path}.{key}: missing")
    return d[key]


def _obj(x: object, path: str, allowed: set[str] | None = None) -> Mapping[str, Any]:
    if not isinstance(x, Mapping):
        raise WireError(f"{path}: expected an object, got {type(x).__name__}")
    if allowed is not None:
        extra = sorted(set(x) - allowed)
        if extra:
            raise WireError(f"{path}: unknown field(s) {', '.join(map(repr, extra))}")
    return x


def _str(x: object, path: str) -> str:
    if not isinstance(x, str):
        raise WireError(f"{path}: expected a string, got {type(x).__name__}")
    return x


def _int(x: object, path: str, minimum: int | None = None) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise WireError(f"{path}: expected an integer, got {x!r}")
    if minimum is not None and x < minimum:
        raise WireError(f"{path}: must be >= {minimum}, got {x}")
    return x


def _num(x: object, path: str) -> float:
    if not is_finite_number(x):
        raise WireError(f"{path}: expected a finite number, got {x!r}")
    return x


def _list(x: object, path: str) -> list[Any]:
    if not isinstance(x, list):
        raise WireError(f"{path}: expected a list, got {type(x).__name__}")
    return x


def _enum(cls: type, x: object, path: str) -> Any:
    try:
        return cls(_str(x, path))
    except ValueError:
        raise WireError(f"{path}: must be one of {', '.join(m.value for m in cls)}; got {x!r}") from None


def check_version(d: Mapping[str, Any], path: str) -> None:
    v = d.get("v")
    if v != WIRE_VERSION:
        raise WireError(f"{path}.v: unsupported wire version {v!r}; this side speaks version {WIRE_VERSION}")


def _issue_from_dict(x: object, path: str) -> Issue:
    d = _obj(x, path, {"name", "kind", "low", "high", "step", "options", "unit", "description"})
    kind = _enum(IssueKind, _get(d, "kind", path), f"{path}.kind")
    try:
        if kind is IssueKind.CATEGORICAL:
            options = tuple(_str(o, f"{path}.options[{k}]") for k, o in enumerate(_list(d.get("options"), path)))
            bounds: dict[str, Any] = {"options": options}
        else:
            bounds = {f: _num(_get(d, f, path), f"{path}.{f}") for f in ("low", "high")}
            if d.get("step") is not None:
                bounds["step"] = _num(d["step"], f"{path}.step")
        return Issue(
            name=_str(_get(d, "name", path), f"{path}.name"),
            kind=kind,
            unit=_str(d.get("unit", ""), f"{path}.unit"),
            description=_str(d.get("description", ""), f"{path}.description"),
            **bounds,
        )
    except WireError:
        raise
    except ValueError as e:
        raise WireError(f"{path}: {e}") from None


def _preferences_from_dict(x: object, issues: tuple[Issue, ...], path: str) -> Preferences:
    d = _obj(x, path, {"reservation", "weights", "values"})
    weights = _obj(_get(d, "weights", path), f"{path}.weights")
    raw_values = _obj(_get(d, "values", path), f"{path}.values")
    names = {i.name for i in issues}
    for key, given in (("weights", weights), ("values", raw_values)):
        if set(given) != names:
            missing, unknown = sorted(names - set(given)), sorted(set(given) - names)
            raise WireError(
                f"{path}.{key}: must name exactly the issues {sorted(names)} (missing {missing}, unknown {unknown})"
            )
    values: dict[str, ValueFunction] = {}
    for issue in issues:
        vpath = f"{path}.values.{issue.name}"
        v = _get(raw_values, issue.name, f"{path}.values")
        if issue.kind is IssueKind.CATEGORICAL:
            table = _obj(v, vpath)
            values[issue.name] = ValueFunction.options({str(k): _num(u, f"{vpath}.{k}") for k, u in table.items()})
        else:
            values[issue.name] = ValueFunction(direction=_enum(Direction, v, vpath))
    prefs = Preferences(
        weights={str(k): _num(w, f"{path}.weights.{k}") for k, w in weights.items()},
        values=values,
        reservation=_num(_get(d, "reservation", path), f"{path}.reservation"),
    )
    try:
        prefs.check(issues)
    except ValueError as e:
        raise WireError(f"{path}: {e}") from None
    return prefs


def _view_from_dict(x: object, path: str) -> ScenarioView:
    fields = {"id", "role", "product", "context", "issues", "preferences", "brief", "max_rounds", "opener"}
    d = _obj(x, path, fields)
    issues = tuple(_issue_from_dict(i, f"{path}.issues[{k}]") for k, i in enumerate(_list(d.get("issues"), path)))
    if not issues:
        raise WireError(f"{path}.issues: needs at least one issue")
    names = [i.name for i in issues]
    if len(set(names)) != len(names):
        raise WireError(f"{path}.issues: duplicate issue names {names}")
    too_many = outcomes_problem([i.size for i in issues])
    if too_many is not None:
        raise WireError(f"{path}.issues: {too_many}")
    max_rounds = _int(_get(d, "max_rounds", path), f"{path}.max_rounds")
    rounds = rounds_problem(max_rounds)
    if rounds is not None:
        raise WireError(f"{path}.max_rounds: {rounds}")
    return ScenarioView(
        id=_str(_get(d, "id", path), f"{path}.id"),
        role=_enum(Role, _get(d, "role", path), f"{path}.role"),
        product=_str(d.get("product", ""), f"{path}.product"),
        context=_str(d.get("context", ""), f"{path}.context"),
        issues=issues,
        preferences=_preferences_from_dict(_get(d, "preferences", path), issues, f"{path}.preferences"),
        brief=_str(d.get("brief", ""), f"{path}.brief"),
        max_rounds=max_rounds,
        opener=_enum(Role, _get(d, "opener", path), f"{path}.opener"),
    )


def _raw_offer(x: object, path: str) -> Offer:
    """An offer as sent: string keys, scalar values (checked against the issues by the protocol, not here)."""
    d = _obj(x, path)
    values: dict[str, Value] = {}
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise WireError(f"{path}.{k}: expected a number or a string, got {v!r}")
        values[str(k)] = v
    return Offer(values)


def _checked_offer(x: object, view: ScenarioView, path: str) -> Offer:
    """An offer the protocol made, so it must be complete and legal for the view's issues."""
    offer = _raw_offer(x, path)
    if set(offer) != {i.name for i in view.issues}:
        raise WireError(f"{path}: must assign exactly the issues {[i.name for i in view.issues]}, got {list(offer)}")
    try:
        return Offer({i.name: i.validate(offer[i.name]) for i in view.issues})
    except ValueError as e:
        raise WireError(f"{path}: {e}") from None


def _move_from_dict(x: object, view: ScenarioView, path: str) -> PublicMove:
    d = _obj(x, path, {"round", "role", "kind", "offer", "message"})
    kind = _enum(ActionKind, _get(d, "kind", path), f"{path}.kind")
    if kind not in _MOVE_KINDS:
        raise WireError(f"{path}.kind: a public move is offer, accept or walk_away; got {kind.value!r}")
    offer = d.get("offer")
    if (kind is ActionKind.OFFER) != (offer is not None):
        raise WireError(f"{path}.offer: an offer move carries an offer and no other move does")
    return PublicMove(
        round=_int(_get(d, "round", path), f"{path}.round", minimum=1),
        role=_enum(Role, _get(d, "role", path), f"{path}.role"),
        kind=kind,
        offer=None if offer is None else _checked_offer(offer, view, f"{path}.offer"),
        message=_str(d.get("message", ""), f"{path}.message"),
    )


def observation_from_dict(x: object) -> Observation:
    """Rebuild an observation from untrusted data; raise :class:`WireError` on the first bad field."""
    path = "observation"
    d = _obj(x, path, {"v", "scenario", "history", "round", "standing_offer", "feedback", "attempt"})
    check_version(d, path)
    view = _view_from_dict(_get(d, "scenario", path), f"{path}.scenario")
    moves = _list(_get(d, "history", path), f"{path}.history")
    if len(moves) > 2 * view.max_rounds:
        raise WireError(f"{path}.history: {len(moves)} moves, more than two per round of {view.max_rounds}")
    history = tuple(_move_from_dict(m, view, f"{path}.history[{k}]") for k, m in enumerate(moves))
    rnd = _int(_get(d, "round", path), f"{path}.round", minimum=1)
    if rnd > view.max_rounds:
        raise WireError(f"{path}.round: {rnd} is past the scenario's max_rounds {view.max_rounds}")
    standing = d.get("standing_offer")
    feedback = d.get("feedback")
    return Observation(
        scenario=view,
        history=history,
        round=rnd,
        standing_offer=None if standing is None else _checked_offer(standing, view, f"{path}.standing_offer"),
        feedback=None if feedback is None else _str(feedback, f"{path}.feedback"),
        attempt=_int(d.get("attempt", 0), f"{path}.attempt", minimum=0),
    )


def _usage_from_dict(x: object, path: str) -> Usage:
    d = _obj(x, path, {*_USAGE_INT_FIELDS, *_USAGE_FLOAT_FIELDS})
    ints = {f: _int(d.get(f, 0), f"{path}.{f}", minimum=0) for f in _USAGE_INT_FIELDS}
    floats = {f: float(_num(d.get(f, 0.0), f"{path}.{f}")) for f in _USAGE_FLOAT_FIELDS}
    return Usage(**ints, **floats)


def action_from_dict(x: object) -> Action:
    """Rebuild an action from untrusted data; raise :class:`WireError` on the first bad field.

    The offer's values are checked for type only: whether they fit the scenario is the protocol's call, so
    an out-of-range offer from a remote agent gets the same feedback as one from a local agent.
    """
    path = "action"
    d = _obj(x, path, {"v", "kind", "offer", "message", "raw", "error", "usage"})
    check_version(d, path)
    kind = _enum(ActionKind, _get(d, "kind", path), f"{path}.kind")
    offer = d.get("offer")
    if (kind is ActionKind.OFFER) != (offer is not None):
        raise WireError(f"{path}.offer: kind 'offer' needs an offer object and other kinds must not carry one")
    usage = d.get("usage")
    return Action(
        kind=kind,
        offer=None if offer is None else _raw_offer(offer, f"{path}.offer"),
        message=_str(d.get("message", ""), f"{path}.message"),
        raw=_str(d.get("raw", ""), f"{path}.raw"),
        error=_str(d.get("error", ""), f"{path}.error"),
        usage=None if usage is None else _usage_from_dict(usage, f"{path}.usage"),
    )
