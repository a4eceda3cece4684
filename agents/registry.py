"""Negotiator specs: turn a string such as ``"boulware"`` or ``"walker:k=4"`` into a negotiator factory.

Rule-based families (their strategies live in ``nego.agents.rules``) are named here; ``py:MODULE:ATTR`` specs and
agents that other packages declare in the entry-point group ``nego.agents`` are resolved by ``nego.agents.plugins``;
any other spec (``openai:...``, ``4.5b-rl``, ...) is handed to ``nego.agents.model_specs.resolve_model_spec`` when
that module is installed. Built-in specs come first: entry points are read only for a name nothing built in takes.
Specs are checked completely in :func:`resolve`, so a typo fails before a market starts.

Spec syntax: ``name`` or ``name:key=value,key2=value2``.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nego.market.marketplace import NegotiatorFactory
from nego.market.protocol import Negotiator
from nego.scenarios.scenario import Role

from .params import ParamValue, UnknownSpecError, parse_params
from .rules.base import Clock
from .rules.deadline import Deadline
from .rules.hazard import Hazard
from .rules.heldout import Picky, Walker
from .rules.outside import OutsideOption
from .rules.reciprocal import Reciprocal
from .rules.simple import Hardliner, RandomValid
from .rules.tft import TitForTat
from .rules.timedep import TimeDependent

MODEL_SPECS_MODULE = "nego.agents.model_specs"
PY_SPEC_FORM = "py:<module>:<attr>"


@dataclass(frozen=True, slots=True)
class _Param:
    kind: type
    default: ParamValue | None  # None: required
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Family:
    build: Callable[..., Negotiator]
    params: Mapping[str, _Param]
    summary: str


_FAMILIES: dict[str, _Family] = {
    "timedep": _Family(
        TimeDependent,
        {
            "e": _Param(float, None),
            "clock": _Param(str, "own", tuple(c.value for c in Clock)),
            "margin": _Param(float, 0.0),
            "patience": _Param(float, 1.0),
            "step": _Param(float, 0.0),
        },
        "time-dependent concession u(t) = 1 - (1 - rv) t^(1/e); e < 1 Boulware, e > 1 Conceder; "
        "margin raises its floor to rv + margin; it walks away once relative time exceeds patience; "
        "each offer aims at least step below its previous one",
    ),
    "tft": _Family(TitForTat, {"k": _Param(float, 1.0)}, "relative tit-for-tat: mirrors the opponent's concessions"),
    "hardliner": _Family(
        Hardliner, {"accept": _Param(float, 0.95)}, "offers only its best outcome, accepts >= accept * best"
    ),
    "random": _Family(RandomValid, {}, "uniformly random offers worth at least its reservation value (seeded)"),
    "walker": _Family(
        Walker,
        {"e": _Param(float, 1.0), "k": _Param(int, 3), "delta": _Param(float, 0.01), "patience": _Param(float, 0.8)},
        "concedes linearly, walks away after k stalled opponent offers or at relative time patience",
    ),
    "picky": _Family(
        Picky,
        {"margin": _Param(float, 0.15), "e": _Param(float, 0.5), "window": _Param(float, 0.05)},
        "accepts only >= rv + margin, offers on the opponent's side of its estimated Pareto frontier",
    ),
    "reciprocal": _Family(
        Reciprocal,
        {"r": _Param(float, 1.0), "harden": _Param(float, 0.2), "tol": _Param(float, 0.005)},
        "concedes r times each opponent concession (own utility); on a stall it moves harden of the way back to "
        "its best; never walks away",
    ),
    "outside": _Family(
        OutsideOption,
        {
            "low": _Param(float, 0.1),
            "high": _Param(float, 0.5),
            "e": _Param(float, 1.0),
            "memory": _Param(float, 0.7),
            "min_offers": _Param(float, 3.0),
        },
        "private outside option rv + U(low, high) (best - rv) per negotiation; accepts anything above it, walks "
        "away when the opponent's trend will not reach it by the deadline",
    ),
    "hazard": _Family(
        Hazard,
        {
            "quit": _Param(float, 0.3),
            "expect": _Param(float, 0.03),
            "memory": _Param(float, 0.5),
            "e": _Param(float, 1.0),
        },
        "concedes time-dependently; leaves each turn with probability quit * stall * (1 + t) / 2, stall rising "
        "as the opponent's recent concessions fall below expect (seeded draws)",
    ),
    "deadline": _Family(
        Deadline,
        {"early": _Param(float, 0.4), "late": _Param(float, 1.0), "e": _Param(float, 2.0)},
        "private deadline U(early, late) per negotiation: concedes to its reservation by then, walks away at it",
    ),
}
_ALIASES: dict[str, tuple[str, dict[str, ParamValue]]] = {
    "boulware": ("timedep", {"e": 0.2}),
    "linear": ("timedep", {"e": 1.0}),
    "conceder": ("timedep", {"e": 2.0}),
}
_ALWAYS_SHOWN = {"timedep": ("e",)}


def _fmt(value: ParamValue) -> str:
    if isinstance(value, float):
        return repr(int(value)) if value.is_integer() else repr(value)
    return str(value)


@dataclass(frozen=True, slots=True)
class RuleFactory:
    """Factory of one rule-based family with fixed parameters."""

    spec: str
    family: str
    params: tuple[tuple[str, ParamValue], ...]
    kind: str = "rule"

    def __call__(self, role: Role, seed: int) -> Negotiator:
        Role(role)
        return _FAMILIES[self.family].build(seed=int(seed), **dict(self.params))


def _parse_value(spec: str, key: str, raw: str, param: _Param) -> ParamValue:
    if param.choices:
        if raw not in param.choices:
            raise UnknownSpecError(f"{spec!r}: {key} must be one of {', '.join(param.choices)}; got {raw!r}")
        return raw
    try:
        value = param.kind(raw)
    except ValueError:
        raise UnknownSpecError(
            f"{spec!r}: {key} must be {'an integer' if param.kind is int else 'a number'}; got {raw!r}"
        ) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UnknownSpecError(f"{spec!r}: {key} must be finite; got {raw!r}")
    return value


def _resolve_rule(spec: str, name: str, text: str | None) -> RuleFactory:
    family_name, values = _ALIASES.get(name, (name, {}))
    family = _FAMILIES[family_name]
    values = {k: p.default for k, p in family.params.items() if p.default is not None} | values
    for key, raw in (parse_params(spec, text) if text is not None else {}).items():
        if key not in family.params:
            allowed = ", ".join(family.params) or "none"
            raise UnknownSpecError(f"{spec!r}: unknown parameter {key!r} for {name}; allowed: {allowed}")
        values[key] = _parse_value(spec, key, raw, family.params[key])
    missing = [k for k, p in family.params.items() if p.default is None and k not in values]
    if missing:
        raise UnknownSpecError(f"{spec!r}: {name} needs {', '.join(f'{k}=<value>' for k in missing)}")
    shown = [
        (k, values[k])
        for k, p in family.params.items()
        if k in values and (k in _ALWAYS_SHOWN.get(family_name, ()) or values[k] != p.default)
    ]
    canonical = family_name + (":" + ",".join(f"{k}={_fmt(v)}" for k, v in shown) if shown else "")
    factory = RuleFactory(canonical, family_name, tuple((k, values[k]) for k in family.params))
    try:
        factory(Role.SELLER, 0)
    except ValueError as e:
        raise UnknownSpecError(f"{spec!r}: {e}") from None
    return factory


def _model_specs_module():
    try:
        return importlib.import_module(MODEL_SPECS_MODULE)
    except ModuleNotFoundError as e:
        if e.name != MODEL_SPECS_MODULE:
            raise
        return None


def resolve(spec: str, settings: object | None = None) -> NegotiatorFactory:
    """The factory for ``spec``; raises :class:`UnknownSpecError` naming the known specs if there is none.

    ``settings`` (an :class:`nego.agents.model_specs.LLMSettings`) configures model specs: prompt template, server,
    tools, sampling, limits and prices; rule specs ignore it."""
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownSpecError(
            f"a negotiator spec must be a non-empty string, got {spec!r}; known: {', '.join(known_specs())}"
        )
    spec = spec.strip()
    name, colon, text = spec.partition(":")
    name = name.strip().lower()
    if name in _FAMILIES or name in _ALIASES:
        return _resolve_rule(spec, name, text if colon else None)
    if name == "py":
        from .plugins import resolve_import_spec

        return resolve_import_spec(spec)
    module = _model_specs_module()
    if module is not None:
        factory = module.resolve_model_spec(spec, settings)
        if factory is not None:
            return factory
    from .plugins import AGENT_GROUP, entry_names, resolve_entry_point

    factory = resolve_entry_point(spec, name, text if colon else None, builtin_form)
    if factory is not None:
        return factory
    plugins = [n for n in entry_names(AGENT_GROUP) if builtin_form(n) is None]
    more = f"; plugin agents: {', '.join(plugins)}" if plugins else ""
    raise UnknownSpecError(f"unknown negotiator spec {spec!r}; known: {', '.join(known_specs())}{more}")


def known_specs() -> list[str]:
    """Spec forms built into nego: rule-based first, then ``py:<module>:<attr>``, then those of the model backends
    when installed. Agents from other packages are listed by ``nego.agents.plugins.list_plugins``."""
    module = _model_specs_module()
    more = getattr(module, "known_model_specs", None) if module is not None else None
    return [*rule_specs(), PY_SPEC_FORM, *(more() if more is not None else [])]


def builtin_form(name: str) -> str | None:
    """The built-in spec form that takes the bare spec name ``name`` (``"walker"`` -> ``"walker"``, ``"openai"`` ->
    ``"openai:<model>"``, ``"x-rl"`` -> ``"<name>-rl"``), or None: an entry point of that name would be shadowed."""
    name = name.strip().lower()
    if name in _FAMILIES or name in _ALIASES:
        return name
    for form in known_specs():
        head = form.partition(":")[0]
        pattern = "".join(".+" if p.startswith("<") else re.escape(p) for p in re.split(r"(<[^>]*>)", head) if p)
        if re.fullmatch(pattern, name):
            return form
    return None


def rule_family(spec: str) -> str | None:
    """The rule-based family ``spec`` names (aliases resolved, parameters ignored), or None for any other spec."""
    name = spec.strip().partition(":")[0].strip().lower()
    if name in _FAMILIES:
        return name
    return _ALIASES[name][0] if name in _ALIASES else None


def rule_specs() -> list[str]:
    """Spec forms of the rule-based families (``<e>`` stands for a number)."""
    return [
        "boulware",
        "linear",
        "conceder",
        "timedep:e=<e>",
        "tft",
        "hardliner",
        "random",
        "walker",
        "picky",
        "reciprocal",
        "outside",
        "hazard",
        "deadline",
    ]


def rule_spec_help() -> dict[str, str]:
    """One line per rule-based family: what it does and its parameters with their defaults."""
    out = {}
    for name, family in _FAMILIES.items():
        params = ", ".join(
            f"{k}={'<required>' if p.default is None else _fmt(p.default)}" for k, p in family.params.items()
        )
        out[name] = family.summary + (f" [{params}]" if params else "")
    for alias, (target, values) in _ALIASES.items():
        out[alias] = f"{target} with " + ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())
    return out
