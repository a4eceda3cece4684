"""A bargaining scenario: public context, issues, and each side's private preferences and brief."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from .issues import Issue, Value
from .limits import outcomes_problem, rounds_problem
from .pickling import compact_pickling
from .preferences import Preferences


class Role(StrEnum):
    SELLER = "seller"
    BUYER = "buyer"

    @property
    def other(self) -> Role:
        return Role.BUYER if self is Role.SELLER else Role.SELLER


@dataclass(frozen=True, slots=True)
class ScenarioView:
    """Everything one side may know about a scenario: the public part plus its own private part."""

    id: str
    role: Role
    product: str
    context: str
    issues: tuple[Issue, ...]
    preferences: Preferences
    brief: str
    max_rounds: int
    opener: Role

    def issue(self, name: str) -> Issue:
        for issue in self.issues:
            if issue.name == name:
                return issue
        raise KeyError(name)

    def utility(self, offer: Mapping[str, Value]) -> float:
        """This side's own utility of ``offer``."""
        return self.preferences.utility(offer, self.issues)


@compact_pickling
@dataclass(frozen=True, slots=True)
class Scenario:
    """A bilateral multi-issue bargaining problem.

    Private information (each side's preferences and brief) leaves a scenario only through :meth:`view_for`.
    ``category`` names the product family; ``zopa`` is False only for scenarios deliberately built without a
    zone of possible agreement.
    """

    id: str
    product: str
    context: str
    issues: tuple[Issue, ...]
    seller: Preferences
    buyer: Preferences
    max_rounds: int = 10
    opener: Role = Role.SELLER
    seller_brief: str = ""
    buyer_brief: str = ""
    category: str = "custom"
    zopa: bool = True
    tags: tuple[str, ...] = field(default=())
    _content_hash: str | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    """:meth:`content_hash`, kept once computed (it travels with the scenario to other processes)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "issues", tuple(self.issues))
        object.__setattr__(self, "opener", Role(self.opener))
        if not self.id:
            raise ValueError("scenario id must be non-empty")
        if not self.issues:
            raise ValueError(f"scenario {self.id!r} needs at least one issue")
        names = [i.name for i in self.issues]
        if len(set(names)) != len(names):
            raise ValueError(f"scenario {self.id!r} has duplicate issue names: {names}")
        rounds = rounds_problem(self.max_rounds)
        if rounds is not None:
            raise ValueError(f"scenario {self.id!r}: max_rounds {rounds}")
        outcomes = outcomes_problem([i.size for i in self.issues])
        if outcomes is not None:
            raise ValueError(f"scenario {self.id!r}: {outcomes}")
        for role, prefs in ((Role.SELLER, self.seller), (Role.BUYER, self.buyer)):
            try:
                prefs.check(self.issues)
            except ValueError as e:
                raise ValueError(f"scenario {self.id!r}, {role} preferences: {e}") from None

    def preferences(self, role: Role) -> Preferences:
        return self.seller if role is Role.SELLER else self.buyer

    def view_for(self, role: Role) -> ScenarioView:
        role = Role(role)
        return ScenarioView(
            id=self.id,
            role=role,
            product=self.product,
            context=self.context,
            issues=self.issues,
            preferences=self.preferences(role),
            brief=self.seller_brief if role is Role.SELLER else self.buyer_brief,
            max_rounds=self.max_rounds,
            opener=self.opener,
        )

    def issue(self, name: str) -> Issue:
        for issue in self.issues:
            if issue.name == name:
                return issue
        raise KeyError(name)

    def utility(self, role: Role, offer: Mapping[str, Value]) -> float:
        return self.preferences(role).utility(offer, self.issues)

    def with_opener(self, opener: Role) -> Scenario:
        from dataclasses import replace

        return replace(self, opener=Role(opener))

    @property
    def outcome_count(self) -> int:
        n = 1
        for issue in self.issues:
            n *= issue.size
        return n

    def content_hash(self) -> str:
        """A stable hash of everything that defines the problem (used to freeze suites and split train/eval)."""
        if self._content_hash is None:
            from .io import scenario_to_dict

            blob = json.dumps(scenario_to_dict(self), sort_keys=True, separators=(",", ":"))
            object.__setattr__(self, "_content_hash", hashlib.sha256(blob.encode()).hexdigest()[:16])
        return self._content_hash  # type: ignore[return-value]
