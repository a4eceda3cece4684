"""Private preferences: linear-additive utilities in [0, 1] with a reservation value."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np

from .issues import Issue, IssueKind, Value
from .pickling import compact_pickling


class Direction(StrEnum):
    INCREASING = "increasing"
    DECREASING = "decreasing"


@compact_pickling
@dataclass(frozen=True, slots=True)
class ValueFunction:
    """Maps one issue's values to [0, 1]: linear in a direction for numeric issues, a table for categorical ones."""

    direction: Direction | None = None
    table: tuple[tuple[str, float], ...] = ()

    def __hash__(self) -> int:
        # str's hash of the direction (a StrEnum) instead of the enum's Python-level one; equal functions still
        # hash alike
        return hash((self.table, 0 if self.direction is None else str.__hash__(self.direction)))

    @staticmethod
    def increasing() -> ValueFunction:
        return ValueFunction(direction=Direction.INCREASING)

    @staticmethod
    def decreasing() -> ValueFunction:
        return ValueFunction(direction=Direction.DECREASING)

    @staticmethod
    def options(values: Mapping[str, float]) -> ValueFunction:
        return ValueFunction(table=tuple(values.items()))

    def __call__(self, issue: Issue, value: Value) -> float:
        if issue.kind is IssueKind.CATEGORICAL:
            for option, v in self.table:
                if option == value:
                    return v
            raise KeyError(value)
        x = (float(value) - issue.low) / (issue.high - issue.low)
        return x if self.direction is Direction.INCREASING else 1.0 - x

    def check(self, issue: Issue) -> None:
        """Raise ValueError if this function does not fit ``issue``."""
        if issue.kind is IssueKind.CATEGORICAL:
            table = dict(self.table)
            if set(table) != set(issue.options):
                raise ValueError(
                    f"values for {issue.name!r} must cover exactly its options {list(issue.options)}, "
                    f"got {sorted(table)}"
                )
            bad = {k: v for k, v in table.items() if not (0.0 <= v <= 1.0)}
            if bad:
                raise ValueError(f"values for {issue.name!r} must lie in [0, 1], got {bad}")
        elif self.direction is None:
            raise ValueError(f"issue {issue.name!r} needs a direction: 'increasing' or 'decreasing'")

    def grid_values(self, issue: Issue) -> np.ndarray:
        """Values of this function on the issue's grid, as a read-only float64 array (computed once per distinct
        function and issue: both are immutable and compare by value)."""
        return _on_grid(self, issue)[2]


_SEEN_PAIRS: dict[tuple[int, int], tuple[ValueFunction, Issue, np.ndarray, dict[Value, float]]] = {}
_MAX_SEEN_PAIRS = 4096


def _on_grid(fn: ValueFunction, issue: Issue) -> tuple[ValueFunction, Issue, np.ndarray, dict[Value, float]]:
    """(fn, issue, fn's values on the grid, {grid value: fn's value}), found by the objects' identities first (each
    new preferences object reuses its scenario's functions and issues), then by their values."""
    key = (id(fn), id(issue))
    hit = _SEEN_PAIRS.get(key)
    if hit is None or hit[0] is not fn or hit[1] is not issue:
        if len(_SEEN_PAIRS) >= _MAX_SEEN_PAIRS:
            _SEEN_PAIRS.clear()
        hit = _SEEN_PAIRS[key] = (fn, issue, *_by_value(fn, issue))  # the entry keeps both alive: ids stay theirs
    return hit


@lru_cache(maxsize=4096)
def _by_value(fn: ValueFunction, issue: Issue) -> tuple[np.ndarray, dict[Value, float]]:
    values = np.array([fn(issue, v) for v in issue.grid()], dtype=np.float64)
    values.setflags(write=False)
    return values, dict(zip(issue.grid(), values.tolist(), strict=True))  # the table is internal, never mutated


def _grid_table(fn: ValueFunction, issue: Issue) -> dict[Value, float]:
    return _on_grid(fn, issue)[3]


@compact_pickling
@dataclass(frozen=True, slots=True)
class Preferences:
    """One side's private preferences: ``utility(offer) = sum_i w_i * v_i(offer[i])``, in [0, 1].

    ``weights`` and ``values`` are keyed by issue name; weights are non-negative and sum to 1. ``reservation``
    is the utility of walking away (the best alternative to a negotiated agreement).
    """

    weights: Mapping[str, float]
    values: Mapping[str, ValueFunction]
    reservation: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", dict(self.weights))
        object.__setattr__(self, "values", dict(self.values))

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.weights.items())), tuple(sorted(self.values.items())), self.reservation))

    def check(self, issues: tuple[Issue, ...]) -> None:
        """Raise ValueError naming the first inconsistency with ``issues``."""
        names = {i.name for i in issues}
        if set(self.weights) != names:
            raise ValueError(f"weights must name exactly the issues {sorted(names)}, got {sorted(self.weights)}")
        if set(self.values) != names:
            raise ValueError(f"values must name exactly the issues {sorted(names)}, got {sorted(self.values)}")
        if any(w < 0 or not math.isfinite(w) for w in self.weights.values()):
            raise ValueError(f"weights must be non-negative, got {self.weights}")
        total = sum(self.weights.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"weights must sum to 1, got {total:.6g}: divide each by {total:.6g}")
        if not (0.0 <= self.reservation <= 1.0):
            raise ValueError(f"reservation must lie in [0, 1], got {self.reservation}")
        for issue in issues:
            self.values[issue.name].check(issue)

    def utility(self, offer: Mapping[str, Value], issues: tuple[Issue, ...]) -> float:
        u = 0.0
        for issue in issues:
            u += self.weights[issue.name] * self.values[issue.name](issue, offer[issue.name])
        return min(1.0, max(0.0, u))

    def scorer(self, issues: tuple[Issue, ...]) -> Callable[[Mapping[str, Value]], float]:
        """A faster ``utility`` for many offers over the same issues: the same terms in the same order, so the
        same floats. A value on its issue's grid is looked up in a table of the value function's values there
        (the same floats it computes); any other value is computed as ``utility`` computes it."""
        terms = [
            (issue.name, self.weights[issue.name], _grid_table(self.values[issue.name], issue), self.values[issue.name])
            for issue in issues
        ]
        by_name = {issue.name: issue for issue in issues}

        def utility(offer: Mapping[str, Value]) -> float:
            u = 0.0
            for name, weight, on_grid, fn in terms:
                value = offer[name]
                v = on_grid.get(value)
                if v is None:
                    v = fn(by_name[name], value)
                u += weight * v
            return _clamp(u)

        return utility

    def grid_utilities(self, issues: tuple[Issue, ...]) -> list[np.ndarray]:
        """Weighted per-issue utility contributions on each issue's grid (sum one entry of each = utility)."""
        return [self.weights[i.name] * self.values[i.name].grid_values(i) for i in issues]


def pair_scorer(
    first: Preferences, second: Preferences, issues: tuple[Issue, ...]
) -> Callable[[Mapping[str, Value]], tuple[float, float]]:
    """Both sides' utilities of an offer in one pass over its values: the same floats as each side's
    :meth:`Preferences.scorer` (each sum in the same order), each value looked up once."""
    terms = [
        (
            issue,
            first.weights[issue.name],
            _grid_table(first.values[issue.name], issue),
            first.values[issue.name],
            second.weights[issue.name],
            _grid_table(second.values[issue.name], issue),
            second.values[issue.name],
        )
        for issue in issues
    ]

    def utilities(offer: Mapping[str, Value]) -> tuple[float, float]:
        u1 = u2 = 0.0
        for issue, w1, grid1, fn1, w2, grid2, fn2 in terms:
            value = offer[issue.name]
            v1 = grid1.get(value)
            if v1 is None:
                v1 = fn1(issue, value)
            v2 = grid2.get(value)
            if v2 is None:
                v2 = fn2(issue, value)
            u1 += w1 * v1
            u2 += w2 * v2
        return _clamp(u1), _clamp(u2)

    return utilities


def _clamp(u: float) -> float:
    """min(1, max(0, u)), NaN to 0 as there."""
    u = u if u > 0.0 else 0.0
    return u if u < 1.0 else 1.0
