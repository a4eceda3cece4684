"""Negotiable issues: what can be put in an offer, its type, range and unit."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from .limits import LimitProblem, is_finite_number, numeric_range_problem, options_problem
from .pickling import compact_pickling

Value = int | float | str


class IssueKind(StrEnum):
    INT = "int"
    FLOAT = "float"
    CATEGORICAL = "categorical"


class InvalidValueError(ValueError):
    """A value that does not fit an issue (wrong type, out of range, unknown option)."""


@compact_pickling
@dataclass(frozen=True, slots=True)
class Issue:
    """One negotiable dimension of a deal.

    Numeric issues have inclusive bounds ``low``..``high`` and a ``step``: for ``int`` issues the legal values
    are ``low, low+step, ..., high``; for ``float`` issues any value in range is legal and ``step`` is only the
    resolution of the grid used by the analysis and by rule-based agents. Categorical issues list ``options``.
    """

    name: str
    kind: IssueKind
    low: float | None = None
    high: float | None = None
    step: float | None = None
    options: tuple[str, ...] = ()
    unit: str = ""
    description: str = ""

    def __hash__(self) -> int:
        # the fields that tell issues apart in practice, without the kind's (Python-level) enum hash: equal issues
        # still hash alike, and the grid caches below look issues up often
        return hash((self.name, self.low, self.high, self.step, self.options))

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"issue name {self.name!r} must be a non-empty identifier (letters, digits, _)")
        if self.kind is IssueKind.CATEGORICAL:
            if len(self.options) < 2 or len(set(self.options)) != len(self.options):
                raise ValueError(f"issue {self.name!r}: a categorical issue needs at least 2 distinct options")
            self._within_limits(options_problem(len(self.options)))
            return
        if self.low is None or self.high is None:
            raise ValueError(f"issue {self.name!r}: a numeric issue needs 'low' and 'high'")
        integer = self.kind is IssueKind.INT
        step = 1 if integer and self.step is None else self.step
        if not all(is_finite_number(x) for x in (self.low, self.high, 1 if step is None else step)):
            raise ValueError(f"issue {self.name!r}: needs finite numbers, got {self.low}..{self.high} step {step}")
        if integer and any(float(x) != int(x) for x in (self.low, self.high, step)):
            raise ValueError(f"issue {self.name!r}: an int issue needs integer low, high and step")
        if integer:
            low, high, step = int(self.low), int(self.high), int(step)
        else:
            low, high = self.low, self.high
        self._within_limits(numeric_range_problem(integer, low, high, step))
        if step is None:
            step = (high - low) / 20
            self._within_limits(numeric_range_problem(integer, low, high, step))
        if integer:
            if (high - low) % step:
                raise ValueError(f"issue {self.name!r}: high - low must be a multiple of step {step}")
            object.__setattr__(self, "low", low)
            object.__setattr__(self, "high", high)
        object.__setattr__(self, "step", step)

    def _within_limits(self, problem: LimitProblem | None) -> None:
        if problem is not None:
            raise ValueError(f"issue {self.name!r}: {problem.field}: {problem.message}")

    @property
    def size(self) -> int:
        """Number of points on this issue's grid."""
        if self.kind is IssueKind.CATEGORICAL:
            return len(self.options)
        if self.kind is IssueKind.INT:
            return (self.high - self.low) // self.step + 1
        return round((self.high - self.low) / self.step) + 1

    def grid(self) -> tuple[Value, ...]:
        """The discrete values used for analysis and by rule-based agents (every legal value for int/categorical)."""
        return _grid(self)

    def grid_is_valid(self) -> bool:
        """True if every grid value passes :meth:`validate` unchanged (so an offer built from grid values needs no
        further check); computed once per distinct issue."""
        return _grid_is_valid(self)

    def _make_grid(self) -> tuple[Value, ...]:
        if self.kind is IssueKind.CATEGORICAL:
            return self.options
        if self.kind is IssueKind.INT:
            return tuple(range(self.low, self.high + 1, self.step))
        n = self.size
        return tuple(round(self.low + (self.high - self.low) * i / (n - 1), 10) for i in range(n))

    def validate(self, value: object) -> Value:
        """Return ``value`` normalised to this issue's type, or raise :class:`InvalidValueError` saying why."""
        if self.kind is IssueKind.CATEGORICAL:
            if isinstance(value, str) and value in self.options:
                return value
            raise InvalidValueError(f"{self.name} must be one of {', '.join(self.options)}; got {value!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidValueError(f"{self.name} must be a number{self._range_text()}; got {value!r}")
        if not is_finite_number(value) or not (self.low <= value <= self.high):
            raise InvalidValueError(f"{self.name} must be{self._range_text()}; got {value!r}")
        if self.kind is IssueKind.INT:
            if float(value) != int(value):
                raise InvalidValueError(f"{self.name} must be a whole number{self._range_text()}; got {value!r}")
            value = int(value)
            if (value - self.low) % self.step:
                raise InvalidValueError(
                    f"{self.name} must be a multiple of {self.step} from {self.low}{self._range_text()}; got {value}"
                )
            return value
        return float(value)

    def _range_text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        step = f" in steps of {self.step}" if self.kind is IssueKind.INT and self.step != 1 else ""
        return f" between {self.low} and {self.high}{unit}{step}"

    def describe(self) -> str:
        """One line for a human or a prompt: name, range or options, unit and description."""
        if self.kind is IssueKind.CATEGORICAL:
            dom = "one of " + ", ".join(self.options)
        else:
            dom = f"{self.kind.value}{self._range_text()}"
        desc = f" ({self.description})" if self.description else ""
        return f"{self.name}: {dom}{desc}"


@lru_cache(maxsize=4096)
def _grid(issue: Issue) -> tuple[Value, ...]:
    """An issue's grid, computed once per distinct issue (issues are immutable and compare by value)."""
    return issue._make_grid()


@lru_cache(maxsize=4096)
def _grid_is_valid(issue: Issue) -> bool:
    try:
        return all(issue.validate(v) is v for v in issue.grid())
    except InvalidValueError:
        return False
