"""The vocabulary of a negotiation: offers, actions, turns, observations and outcomes."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import TypeVar

from nego.scenarios.issues import Value
from nego.scenarios.scenario import Role, ScenarioView

T = TypeVar("T")


def _quick_init(cls: type[T]) -> type[T]:
    """Give a frozen slots dataclass an ``__init__`` that fills each slot through its descriptor: the same signature
    and the same object, made about twice as fast (the protocol makes several of these per turn). The instances stay
    frozen: only ``__init__`` bypasses the class's ``__setattr__``."""
    params, body, namespace = [], [], {}
    for f in fields(cls):
        if f.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a default factory needs the generated __init__")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is MISSING:
            params.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[misc]
    return cls


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


class Offer(Mapping[str, Value]):
    """A complete assignment of a value to every issue, read like a dict: ``offer["price"]``. Immutable."""

    __slots__ = ("_hash", "_json", "_valid_for", "_values")

    def __init__(self, values: Mapping[str, Value]) -> None:
        self._values = dict(values)
        self._hash: int | None = None
        self._json: str | None = None
        self._valid_for: object = None
        """The issues tuple this offer was last found valid and normalised for (see ``protocol.check_offer``)."""

    @classmethod
    def known_valid(cls, values: Mapping[str, Value], issues: tuple) -> Offer:
        """An offer whose values the caller built from ``issues``' validated grids, in the issues' order: the
        protocol accepts it for those issues without checking each value again. The offer takes ``values`` over
        (a dict is not copied: the caller must not keep changing it)."""
        offer = cls.__new__(cls)
        offer._values = values if type(values) is dict else dict(values)
        offer._hash = None
        offer._json = None
        offer._valid_for = issues
        return offer

    @classmethod
    def encoded(cls, values: dict[str, Value], text: str) -> Offer:
        """The offer of ``values`` whose :meth:`to_json` is ``text``, which the caller took from an offer of the same
        values (an offer that crossed a process boundary: it is not encoded a second time). Takes ``values`` over."""
        offer = cls.__new__(cls)
        offer._values = values
        offer._hash = None
        offer._json = text
        offer._valid_for = None
        return offer

    def __getitem__(self, key: str) -> Value:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._values.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Offer):
            return self._values == other._values
        return isinstance(other, Mapping) and self._values == dict(other)

    def __repr__(self) -> str:
        return f"Offer({self._values!r})"

    def to_dict(self) -> dict[str, Value]:
        return dict(self._values)

    def as_mapping(self) -> Mapping[str, Value]:
        """The values themselves, not a copy, for reading them many times without this class's item lookup (a
        scorer reads every value of every offer); typed read-only, and never to be changed."""
        return self._values

    def to_json(self) -> str:
        """The offer as a compact JSON object, in issue order (made once per offer: transcripts write it per turn)."""
        if self._json is None:
            self._json = _COMPACT_JSON.encode(self._values)
        return self._json

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self._values.items())


class ActionKind(StrEnum):
    OFFER = "offer"
    ACCEPT = "accept"
    WALK_AWAY = "walk_away"
    INVALID = "invalid"  # the agent could not produce a well-formed action (e.g. unparseable model output)


@dataclass(frozen=True, slots=True)
class Usage:
    """What producing one action cost: tokens, latency, money. Zero for rule-based agents."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0
    calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.latency_s + other.latency_s,
            self.cost_usd + other.cost_usd,
            self.calls + other.calls,
        )


@_quick_init
@dataclass(frozen=True, slots=True)
class Action:
    """One move. ``offer`` is set only for OFFER; ``message`` is free text shown to the other side;
    ``raw`` keeps a model's raw output and ``error`` the parser's complaint for INVALID actions."""

    kind: ActionKind
    offer: Offer | None = None
    message: str = ""
    raw: str = ""
    error: str = ""
    usage: Usage | None = None

    @staticmethod
    def make_offer(offer: Mapping[str, Value], message: str = "") -> Action:
        return Action(ActionKind.OFFER, offer if isinstance(offer, Offer) else Offer(offer), message)

    @staticmethod
    def accept(message: str = "") -> Action:
        return Action(ActionKind.ACCEPT, message=message)

    @staticmethod
    def walk_away(message: str = "") -> Action:
        return Action(ActionKind.WALK_AWAY, message=message)

    @staticmethod
    def invalid(raw: str, error: str, usage: Usage | None = None) -> Action:
        return Action(ActionKind.INVALID, raw=raw, error=error, usage=usage)


@_quick_init
@dataclass(frozen=True, slots=True)
class PublicMove:
    """A move as both sides see it: who, in which round, what kind, the offer and the message."""

    round: int
    role: Role
    kind: ActionKind
    offer: Offer | None
    message: str = ""


@_quick_init
@dataclass(frozen=True, slots=True)
class Observation:
    """What one side sees when it must act. Built by the protocol from :meth:`Scenario.view_for` only."""

    scenario: ScenarioView
    history: tuple[PublicMove, ...]
    round: int
    standing_offer: Offer | None
    feedback: str | None = None
    attempt: int = 0

    @property
    def role(self) -> Role:
        return self.scenario.role

    @property
    def rounds_left(self) -> int:
        """Rounds left including the current one (1 means this is this side's last chance)."""
        return self.scenario.max_rounds - self.round + 1

    @property
    def is_last_turn(self) -> bool:
        """True if no further move of this side will follow this one."""
        return not self.round < self.scenario.max_rounds


@_quick_init
@dataclass(frozen=True, slots=True)
class Turn:
    """One attempted move as recorded in a transcript (invalid attempts included)."""

    index: int
    round: int
    role: Role
    attempt: int
    action: Action
    valid: bool
    feedback: str | None = None
    utility_seller: float | None = None
    utility_buyer: float | None = None


class EndReason(StrEnum):
    AGREEMENT = "agreement"
    WALK_AWAY = "walk_away"
    DEADLINE = "deadline"
    ERROR = "error"


ROLE_OF = {r.value: r for r in Role}
KIND_OF = {k.value: k for k in ActionKind}
REASON_OF = {r.value: r for r in EndReason}
"""Each enum member by its value, for rebuilding records from plain values (a dict lookup, not the enum's call)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a negotiation ended. Without agreement, each side's utility is its reservation value."""

    end_reason: EndReason
    agreement: Offer | None
    seller_utility: float
    buyer_utility: float
    rounds: int
    turns: int
    ended_by: Role | None = None
    invalid_seller: int = 0
    invalid_buyer: int = 0
    forfeits_seller: int = 0
    forfeits_buyer: int = 0
    error: str = ""

    @property
    def agreed(self) -> bool:
        return self.end_reason is EndReason.AGREEMENT


@dataclass(frozen=True, slots=True)
class NegotiationResult:
    """A finished negotiation: its outcome and every turn, with what it cost each side."""

    scenario_id: str
    seed: int
    outcome: Outcome
    turns: tuple[Turn, ...]
    usage_seller: Usage = field(default_factory=Usage)
    usage_buyer: Usage = field(default_factory=Usage)
