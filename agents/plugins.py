"""Agents and scenario sources from other packages: entry points and ``py:`` import paths.

An installed distribution offers agents in the entry-point group ``nego.agents`` (spec ``NAME`` or
``NAME:key=value,...``) and scenario sources in ``nego.scenarios`` (``--scenarios plugin:NAME``). Any importable
object is also reachable without packaging as ``py:MODULE:ATTR`` (agents: ``py:MODULE:ATTR:key=value,...``).

Agent contract: the target (a class or any callable) is called as ``target(role=Role, seed=int, **params)`` once per
negotiation side and returns an object with an ``async def act(self, obs) -> Action`` method. A parameter value
written as an integer (``k=2``) is passed as ``int``, as a decimal number (``aggr=0.3``, ``1e-3``) as ``float``,
anything else as ``str``. When the target's signature can be read, an unknown or missing parameter fails at resolve
time with the accepted ones listed (a ``**kwargs`` target takes any). Resolving builds one seller with seed 0, so a
constructor that raises, or an object without an async ``act``, fails the spec before any run starts. The factory's
``kind`` is ``"plugin"`` (``--per-kind plugin=N`` caps them). When credentials are set in the environment, a plugin
agent's messages, raw replies and error texts pass through the same scrubber as a model-backed agent's.

An entry point never replaces a built-in spec: one named like a rule family, a model prefix (``openai``), a size
alias, ``tiny`` or ``NAME-rl`` is reported as shadowed, and ``py:TARGET`` still reaches it.

Scenario-source contract: the target is a callable ``seed -> Scenario`` (one required positional parameter; called
once per drawn scenario) or a callable without required parameters that returns a non-empty list of scenarios.

Entry points are read only when a spec is not built in, or for a listing, and cached; :func:`clear_cache` forgets
them (after installing a package in a running process).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nego.market.protocol import Negotiator, NegotiatorError
from nego.market.types import Action, Observation
from nego.scenarios.scenario import Role, Scenario

from .params import ParamValue, UnknownSpecError, parse_params
from .secrets import Scrubber

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

AGENT_GROUP = "nego.agents"
SCENARIO_GROUP = "nego.scenarios"
PY_PREFIX = "py:"
PLUGIN_PREFIX = "plugin:"
PLUGIN_KIND = "plugin"

_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_SPEC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_GIVEN_BY_NEGO = ("role", "seed")

BuiltinForm = Callable[[str], str | None]
"""Maps a bare spec name to the built-in spec form that takes it (``"openai"`` -> ``"openai:<model>"``), or None."""


class PluginError(ValueError):
    """An import path or entry point that cannot be used; the message says which one and why."""


class ScenarioSourceError(ValueError):
    """A ``plugin:`` or ``py:`` scenario source that cannot be used, or that produced something not a Scenario."""


# --- values ------------------------------------------------------------------------------------------------------


def parse_value(raw: str) -> ParamValue:
    """``"2"`` -> 2, ``"0.3"`` / ``"1e-3"`` -> float, anything else unchanged; a non-finite number is refused."""
    try:
        if _INT.fullmatch(raw):
            return int(raw)
        if _FLOAT.fullmatch(raw):
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError(f"{raw!r} is too large")
            return value
    except ValueError as e:
        raise PluginError(f"{raw!r} is not a usable number ({e})") from None
    return raw


def format_value(value: ParamValue) -> str:
    """The spec text of a parsed value; ``parse_value(format_value(v)) == v`` with the same type."""
    return repr(value) if isinstance(value, float) else str(value)


# --- importing ---------------------------------------------------------------------------------------------------


def import_object(module: str, attr: str | None) -> object:
    """``module.attr`` (``attr`` may be dotted, or None for the module itself); :class:`PluginError` says why not."""
    try:
        obj: object = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise PluginError(f"no module named {module!r}") from None
        raise PluginError(f"importing {module} failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # user code runs on import: any failure is reported, none escapes
        raise PluginError(f"importing {module} raised {type(e).__name__}: {e}") from None
    for i, part in enumerate(attr.split(".") if attr else ()):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = ".".join([module, *attr.split(".")[:i]])  # type: ignore[union-attr]
            raise PluginError(f"{where} has no attribute {part!r}") from None
    return obj


def _split_target(text: str) -> tuple[str, str]:
    module, colon, attr = text.partition(":")
    if not colon or not _DOTTED.fullmatch(module) or not _DOTTED.fullmatch(attr):
        raise PluginError(f"{text!r} must look like <module>:<attr>, e.g. mypkg.bots:MyBot")
    return module, attr


def _describe(obj: object) -> str:
    return f"a {type(obj).__name__} object"


# --- entry points ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PluginEntry:
    """One entry point in a nego group, as ``nego agents`` lists it."""

    group: str
    name: str
    target: str
    """``module:attr`` as the entry point declares it."""
    distribution: str
    """``NAME VERSION`` of the distribution that declares it."""
    status: str = "ok"
    """``ok``, ``broken`` (cannot be used, see ``problem``) or ``shadowed`` (a built-in spec takes its name)."""
    problem: str = ""


@functools.cache
def _entry_points(group: str) -> tuple[EntryPoint, ...]:
    from importlib.metadata import entry_points

    return tuple(sorted(entry_points(group=group), key=lambda ep: (ep.name.lower(), ep.value)))


def clear_cache() -> None:
    """Forget discovered entry points and the import system's directory caches."""
    _entry_points.cache_clear()
    importlib.invalidate_caches()


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown distribution"
    return f"{dist.metadata['Name'] or '?'} {dist.version or ''}".strip()


def _named(group: str, name: str) -> list[EntryPoint]:
    key = name.lower()
    return [ep for ep in _entry_points(group) if ep.name.lower() == key]


def _unique(group: str, name: str) -> EntryPoint | None:
    """The one entry point named ``name`` in ``group`` (names compare case-insensitively), None if there is none."""
    found = _named(group, name)
    if len({ep.value for ep in found}) > 1:
        offers = "; ".join(f"{ep.value} from {_distribution(ep)}" for ep in found)
        raise PluginError(f"several entry points in {group} are named {name!r} ({offers}); write py:<module>:<attr>")
    return found[0] if found else None


def _load(ep: EntryPoint) -> object:
    module, _, attr = ep.value.partition(":")
    attr = attr.split("[", 1)[0].strip() or None  # drop extras: 'mod:obj [extra]'
    return import_object(module.strip(), attr)


def entry_names(group: str) -> list[str]:
    """The names declared in ``group``, without importing anything."""
    return sorted({ep.name for ep in _entry_points(group)}, key=str.lower)


def list_plugins(group: str, builtin: BuiltinForm | None = None) -> list[PluginEntry]:
    """Every entry point of ``group`` with its status; imports each target (a failure makes that entry broken)."""
    out = []
    for ep in _entry_points(group):
        status, problem = "ok", ""
        form = builtin(ep.name) if builtin is not None else None
        others = [o for o in _named(group, ep.name) if o.value != ep.value]
        if form:
            status, problem = "shadowed", f"the built-in spec {form} takes this name; reach it as py:{ep.value}"
        elif not _SPEC_NAME.fullmatch(ep.name):
            status, problem = "broken", "the name is not usable in a spec (letters, digits, '_', '.', '-')"
        elif others:
            status, problem = (
                "broken",
                "the name is also declared by " + ", ".join(f"{o.value} from {_distribution(o)}" for o in others),
            )
        else:
            try:
                target = _load(ep)
            except PluginError as e:
                status, problem = "broken", str(e)
            else:
                check = _agent_signature_problem if group == AGENT_GROUP else _source_signature_problem
                found = check(target)
                status, problem = ("broken", found) if found else ("ok", "")
        out.append(PluginEntry(group, ep.name, ep.value, _distribution(ep), status, problem))
    return out


# --- agents ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PluginFactory:
    """Builds negotiators from a plugin target: ``build(role=role, seed=seed, **params)``."""

    spec: str
    target: str
    """``module:attr`` the negotiators come from."""
    build: Callable[..., Negotiator] = field(repr=False)
    params: tuple[tuple[str, ParamValue], ...] = ()
    kind: str = PLUGIN_KIND

    def __call__(self, role: Role, seed: int) -> Negotiator:
        agent = self.build(role=Role(role), seed=int(seed), **dict(self.params))
        scrub = Scrubber.from_env()
        return _Scrubbed(agent, scrub) if scrub else agent


@dataclass(frozen=True, slots=True)
class _Scrubbed:
    """A plugin agent whose moves and errors pass through the credential scrubber, as a model-backed agent's do:
    a plugin may wrap a model or a server that writes a key back into its reply."""

    inner: Negotiator
    scrub: Scrubber

    async def act(self, obs: Observation) -> Action:
        try:
            action = await self.inner.act(obs)
        except Exception as e:  # the plugin's own error text may hold a key; the protocol ends the negotiation
            raise NegotiatorError(self.scrub(f"{type(e).__name__}: {e}")) from None
        return self.scrub.action(action) if isinstance(action, Action) else action


def _signature(target: object) -> inspect.Signature | None:
    try:
        return inspect.signature(target)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # some builtins and C types have none: the trial build is the only check
        return None


def _keyword_params(sig: inspect.Signature) -> tuple[dict[str, inspect.Parameter], bool]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {n: p for n, p in sig.parameters.items() if p.kind in kinds}
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def _agent_signature_problem(target: object) -> str:
    """Why ``target`` cannot be called as ``target(role=..., seed=...)``, or ''."""
    if not callable(target):
        return f"it is {_describe(target)}, not a class or a callable"
    sig = _signature(target)
    if sig is None:
        return ""
    named, any_keyword = _keyword_params(sig)
    if not any_keyword and not all(n in named for n in _GIVEN_BY_NEGO):
        return f"it must accept the keyword arguments role and seed; its signature is {sig}"
    return ""


def _checked_params(where: str, sig: inspect.Signature, params: dict[str, ParamValue]) -> dict[str, ParamValue]:
    """``params`` in signature order without those equal to their defaults; UnknownSpecError on a bad one."""
    named, any_keyword = _keyword_params(sig)
    accepted = [n for n in named if n not in _GIVEN_BY_NEGO]
    for key in params:
        if key in _GIVEN_BY_NEGO:
            raise UnknownSpecError(f"{where}: {key} is given by nego to every agent; it cannot be a spec parameter")
        if key not in named and not any_keyword:
            raise UnknownSpecError(f"{where}: unknown parameter {key!r}; accepted: {', '.join(accepted) or 'none'}")
    missing = [n for n in accepted if named[n].default is inspect.Parameter.empty and n not in params]
    if missing:
        raise UnknownSpecError(f"{where}: needs {', '.join(f'{k}=<value>' for k in missing)}")
    try:
        sig.bind(role=Role.SELLER, seed=0, **params)
    except TypeError as e:
        raise UnknownSpecError(f"{where}: cannot be called with role=, seed= and these parameters: {e}") from None
    order = {n: i for i, n in enumerate(named)}
    kept = {
        k: v
        for k, v in params.items()
        if not (k in named and type(named[k].default) is type(v) and named[k].default == v)
    }
    return dict(sorted(kept.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def _agent_factory(spec: str, name: str, path: str, label: str, target: object, text: str | None) -> PluginFactory:
    """``name``: the canonical spec without parameters; ``path``: ``module:attr``; ``label``: where it comes from."""
    where = f"{spec!r} ({label})"
    problem = _agent_signature_problem(target)
    if problem:
        raise UnknownSpecError(f"{where}: {problem}")
    params: dict[str, ParamValue] = {}
    for key, raw in (parse_params(spec, text) if text is not None else {}).items():
        try:
            params[key] = parse_value(raw)
        except PluginError as e:
            raise UnknownSpecError(f"{where}: {key}: {e}") from None
    sig = _signature(target)
    params = _checked_params(where, sig, params) if sig is not None else dict(sorted(params.items()))
    canonical = name + (":" + ",".join(f"{k}={format_value(v)}" for k, v in params.items()) if params else "")
    factory = PluginFactory(canonical, path, target, tuple(params.items()))  # type: ignore[arg-type]
    try:
        agent = factory.build(role=Role.SELLER, seed=0, **params)  # the plugin's own object, not its scrubbed wrapper
    except Exception as e:  # the user's constructor: report whatever it raises
        raise UnknownSpecError(f"{where}: building a seller with seed 0 raised {type(e).__name__}: {e}") from None
    act = getattr(agent, "act", None)
    if act is None:
        raise UnknownSpecError(f"{where}: built {_describe(agent)} without an act method; write async def act(obs)")
    if not inspect.iscoroutinefunction(act):
        raise UnknownSpecError(f"{where}: {type(agent).__name__}.act must be async: async def act(self, obs)")
    return factory


def resolve_import_spec(spec: str) -> PluginFactory:
    """The factory for ``py:MODULE:ATTR`` or ``py:MODULE:ATTR:key=value,...``."""
    body = spec.strip()[len(PY_PREFIX) :] if spec.strip().lower().startswith(PY_PREFIX) else ""
    module, _, rest = body.partition(":")
    attr, colon, text = rest.partition(":")
    if not _DOTTED.fullmatch(module.strip()) or not _DOTTED.fullmatch(attr.strip()):
        raise UnknownSpecError(f"{spec!r}: write py:<module>:<attr> or py:<module>:<attr>:key=value,...")
    module, attr = module.strip(), attr.strip()
    try:
        target = import_object(module, attr)
    except PluginError as e:
        raise UnknownSpecError(f"{spec!r}: {e}") from None
    path = f"{module}:{attr}"
    return _agent_factory(spec, f"py:{path}", path, path, target, text if colon else None)


def resolve_entry_point(spec: str, name: str, text: str | None, builtin: BuiltinForm) -> PluginFactory | None:
    """The factory for an agent entry point named ``name`` (``text``: its parameters), None if there is none."""
    try:
        ep = _unique(AGENT_GROUP, name)
    except PluginError as e:
        raise UnknownSpecError(f"{spec!r}: {e}") from None
    if ep is None:
        return None
    label = f"{ep.value}, from {_distribution(ep)}"
    form = builtin(ep.name)
    if form:
        raise UnknownSpecError(
            f"{spec!r}: the plugin agent {ep.name!r} ({label}) is shadowed by the built-in spec {form}; "
            f"write py:{ep.value}"
        )
    try:
        target = _load(ep)
    except PluginError as e:
        raise UnknownSpecError(f"{spec!r}: the plugin agent {ep.name!r} ({label}) cannot be loaded: {e}") from None
    return _agent_factory(spec, ep.name, ep.value, label, target, text)


# --- scenario sources --------------------------------------------------------------------------------------------


def _required_positional(sig: inspect.Signature) -> tuple[int, list[str]]:
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in sig.parameters.values() if p.default is inspect.Parameter.empty]
    n = sum(p.kind in positional for p in required)
    return n, [p.name for p in required if p.kind is inspect.Parameter.KEYWORD_ONLY]


def _source_signature_problem(target: object) -> str:
    if not callable(target):
        return f"it is {_describe(target)}, not a callable"
    sig = _signature(target)
    if sig is None:
        return "its signature cannot be read, so nego cannot tell seed -> Scenario from a list source"
    n, keyword_only = _required_positional(sig)
    if keyword_only or n > 1:
        return f"it must take one argument (seed -> Scenario) or none (returning a list of scenarios); it is {sig}"
    return ""


@dataclass(frozen=True, slots=True)
class SeededSource:
    """A ``seed -> Scenario`` plugin source that checks what it gets back."""

    where: str
    make: Callable[[int], object] = field(repr=False)

    def __call__(self, seed: int) -> Scenario:
        try:
            scenario = self.make(seed)
        except Exception as e:  # user code: name the source and the seed
            raise ScenarioSourceError(f"{self.where}: seed {seed} raised {type(e).__name__}: {e}") from None
        if not isinstance(scenario, Scenario):
            raise ScenarioSourceError(f"{self.where}: seed {seed} gave {_describe(scenario)}, not a Scenario")
        return scenario


def _scenario_list(where: str, make: Callable[[], object]) -> list[Scenario]:
    try:
        produced = make()
    except Exception as e:  # user code
        raise ScenarioSourceError(f"{where}: raised {type(e).__name__}: {e}") from None
    if isinstance(produced, str | bytes | Mapping | Scenario) or not isinstance(produced, Iterable):
        raise ScenarioSourceError(
            f"{where}: a source without arguments must return a list of scenarios, got {_describe(produced)} "
            "(a seed -> Scenario source takes the seed as its one argument)"
        )
    scenarios = list(produced)
    bad = [i for i, s in enumerate(scenarios) if not isinstance(s, Scenario)]
    if bad:
        raise ScenarioSourceError(f"{where}: item {bad[0]} is {_describe(scenarios[bad[0]])}, not a Scenario")
    if not scenarios:
        raise ScenarioSourceError(f"{where}: returned no scenarios")
    return scenarios


def load_scenario_source(source: str) -> list[Scenario] | SeededSource:
    """Scenarios from ``plugin:NAME`` (group ``nego.scenarios``) or ``py:MODULE:ATTR``: a list, or a checked
    ``seed -> Scenario`` function (probed once with seed 0, so a broken one fails before a run)."""
    where = f"scenario source {source!r}"
    try:
        if source.startswith(PLUGIN_PREFIX):
            name = source[len(PLUGIN_PREFIX) :].strip()
            ep = _unique(SCENARIO_GROUP, name)
            if ep is None:
                installed = ", ".join(entry_names(SCENARIO_GROUP)) or "none"
                raise ScenarioSourceError(
                    f"{where}: no entry point {name!r} in {SCENARIO_GROUP}; installed: {installed}"
                )
            where, target = f"{where} ({ep.value}, from {_distribution(ep)})", _load(ep)
        elif source.startswith(PY_PREFIX):
            target = import_object(*_split_target(source[len(PY_PREFIX) :].strip()))
        else:
            raise ScenarioSourceError(f"{where}: write plugin:<name> or py:<module>:<attr>")
    except PluginError as e:
        raise ScenarioSourceError(f"{where}: {e}") from None
    problem = _source_signature_problem(target)
    if problem:
        raise ScenarioSourceError(f"{where}: {problem}")
    if _required_positional(_signature(target))[0] == 0:  # type: ignore[arg-type]
        return _scenario_list(where, target)  # type: ignore[arg-type]
    seeded = SeededSource(where, target)  # type: ignore[arg-type]
    seeded(0)
    return seeded
