"""Upper bounds on what a scenario may define, shared by scenario files, the generator, ``check_scenario`` and the
agent server.

The analysis enumerates every outcome, rule-based agents may enumerate an issue's grid, and the protocol plays
every round, so these bounds are what keeps a hostile or mistyped scenario from taking unbounded time or memory.
Every shipped and generated scenario stays far inside them (the largest generated one has 31 points on an issue,
43,400 outcomes and 10 rounds; training allows at most 30 rounds).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

MAX_ROUNDS = 1_000
"""Most rounds a negotiation may last (suites and training use 10; training allows at most 30)."""

MAX_ISSUE_POINTS = 10_000
"""Most grid points on one issue: int values, float steps across the range, or categorical options."""

MAX_OUTCOMES = 1_000_000
"""Most outcomes (product of the issues' grid sizes) a scenario may have."""

MAX_BOUND = 1e15
"""Largest magnitude of an issue's ``low`` and ``high``; below 2**53, so every whole number in range is an exact
float and utilities of int issues are computed exactly."""

MIN_STEP = 1e-9
"""Smallest float step: grid values are rounded to 10 decimals, so finer steps would give repeated grid points."""

MIN_RELATIVE_STEP = 1e-12
"""Smallest float step relative to the larger of ``|low|`` and ``|high|``, so neighbouring grid points stay distinct
floating-point numbers."""

MAX_DEPTH = 32
"""Deepest nesting of tables and lists in a scenario file or a wire body (a scenario needs 4, an observation 7)."""

MAX_INT_DIGITS = 20
"""Most digits of an integer in a scenario file or a wire body (a 64-bit integer has at most 19)."""

MAX_FILE_BYTES = 4 << 20
"""Largest scenario file read (the biggest shipped example is under 4 KiB)."""


@dataclass(frozen=True, slots=True)
class LimitProblem:
    """Why an issue's range does not fit the limits: the field at fault (``low``, ``high``, ``step``, ``options``),
    what is wrong and how to fix it."""

    field: str
    message: str
    fix: str


def is_finite_number(x: object) -> bool:
    """True for an int or float (not a bool) that is a finite float; never overflows on huge integers."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return -sys.float_info.max <= x <= sys.float_info.max  # compared exactly, without converting x
    return isinstance(x, float) and math.isfinite(x)


def numeric_range_problem(integer: bool, low: float, high: float, step: float | None) -> LimitProblem | None:
    """The first way a numeric issue's range breaks the limits, or None.

    ``low`` and ``high`` must be finite numbers (see :func:`is_finite_number`) and ``step`` a finite number or None
    (None: 1 for int issues, a twentieth of the range for float issues); for an int issue all three are whole.
    """
    for name, value in (("low", low), ("high", high)):
        if abs(value) > MAX_BOUND:
            return LimitProblem(
                name, f"{value!r} is beyond the limit of {MAX_BOUND:.0e} in magnitude", "use larger units"
            )
    if high <= low:
        return LimitProblem("high", f"high ({high}) must exceed low ({low})", "swap or fix them")
    width = high - low
    if step is None:
        return None
    if step <= 0:
        return LimitProblem("step", f"step must be positive, got {step!r}", "use step = 1")
    if step > width:
        return LimitProblem(
            "step", f"step {step} is wider than the range {low}..{high}", f"use a step of at most {width}"
        )
    if integer:
        points = int(width) // int(step) + 1
    else:
        finest = max(MIN_STEP, MIN_RELATIVE_STEP * max(abs(low), abs(high)))
        if step < finest:
            return LimitProblem(
                "step",
                f"step {step!r} is finer than {finest:.3g}, the resolution of a grid at this scale",
                "use a coarser step",
            )
        points = round(width / step) + 1
    if points > MAX_ISSUE_POINTS:
        return LimitProblem(
            "step",
            f"the range {low}..{high} in steps of {step} has {points:,} points (limit {MAX_ISSUE_POINTS:,})",
            f"use a step of at least {_coarsest(width, integer)} or a narrower range",
        )
    return None


def _coarsest(width: float, integer: bool) -> str:
    step = width / (MAX_ISSUE_POINTS - 1)
    return str(math.ceil(step)) if integer else f"{step:.3g}"


def options_problem(count: int) -> LimitProblem | None:
    """Whether a categorical issue with ``count`` options breaks the limits."""
    if count > MAX_ISSUE_POINTS:
        return LimitProblem(
            "options", f"{count:,} options (limit {MAX_ISSUE_POINTS:,})", "merge options into fewer categories"
        )
    return None


def outcomes_problem(sizes: list[int] | tuple[int, ...]) -> str | None:
    """Whether issues with these grid sizes have too many outcomes together (a saturating product, so thousands
    of issues cost no more than a few)."""
    total = 1
    for size in sizes:
        total = min(total * size, _SATURATED)
    if total <= MAX_OUTCOMES:
        return None
    shown = f"{total:,}" if total < _SATURATED else f"more than {_SATURATED:.0e}"
    return f"the outcome grid has {shown} outcomes (limit {MAX_OUTCOMES:,})"


_SATURATED = 10**18


def rounds_problem(rounds: int) -> str | None:
    """Whether ``rounds`` is outside 1..:data:`MAX_ROUNDS`."""
    if not 1 <= rounds <= MAX_ROUNDS:
        return f"must lie in 1..{MAX_ROUNDS}, got {rounds}"
    return None
