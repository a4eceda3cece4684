"""Exact analysis of a scenario's outcome space: utilities, Pareto frontier, Nash point, zone of agreement.

The outcome space is the cartesian product of every issue's grid (:meth:`Issue.grid`): every legal value of an
int or categorical issue, and float issues at their ``step`` (the documented resolution of the analysis). An
outcome is addressed by a flat index in row-major order over the issues as listed in the scenario (the last
issue varies fastest), so ``utilities(scenario)[0][k]`` is the seller's utility of ``offer_at(scenario, k)``.
All quantities are computed with numpy over the whole grid by broadcasting per-issue utility vectors; grid
utilities are rounded to 12 decimals so that exact ties stay ties.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .issues import Issue, Value
from .scenario import Scenario

if TYPE_CHECKING:
    from nego.market.types import Offer

_ZERO_SUM_DISTANCE = 1.0 / math.sqrt(2.0)
"""Distance from (1, 1) to the zero-sum line u_s + u_b = 1: the scale of the opposition measure."""


@dataclass(frozen=True, slots=True)
class OutcomeSpace:
    """The discrete grid of a scenario's outcomes, mapping flat indices to offers and back."""

    issues: tuple[Issue, ...]
    grids: tuple[tuple[Value, ...], ...]
    shape: tuple[int, ...]

    @staticmethod
    def of(issues: tuple[Issue, ...]) -> OutcomeSpace:
        grids = tuple(i.grid() for i in issues)
        return OutcomeSpace(tuple(issues), grids, tuple(len(g) for g in grids))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def values_at(self, index: int) -> dict[str, Value]:
        """The issue values of outcome ``index`` as a plain dict."""
        if not 0 <= index < self.size:
            raise IndexError(f"outcome index {index} out of range 0..{self.size - 1}")
        coords = np.unravel_index(index, self.shape)
        return {i.name: g[int(c)] for i, g, c in zip(self.issues, self.grids, coords, strict=True)}

    def index_of(self, offer: Mapping[str, Value]) -> int:
        """Flat index of an offer whose values all lie on the grid; raise ValueError naming the first that does not."""
        coords = []
        for issue, grid in zip(self.issues, self.grids, strict=True):
            value = offer[issue.name]
            coords.append(_grid_position(issue, grid, value))
        return int(np.ravel_multi_index(coords, self.shape))


def _grid_position(issue: Issue, grid: tuple[Value, ...], value: Value) -> int:
    if isinstance(value, str):
        if value in grid:
            return grid.index(value)
    elif not isinstance(grid[0], str):
        pos = round((float(value) - issue.low) / issue.step)
        if 0 <= pos < len(grid) and math.isclose(float(grid[pos]), float(value), rel_tol=1e-9, abs_tol=1e-9):
            return pos
    raise ValueError(f"{issue.name}={value!r} is not on the analysis grid of {issue.name}")


def outcome_space(issues: tuple[Issue, ...]) -> OutcomeSpace:
    """The outcome grid over ``issues`` (see the module docstring for the index order)."""
    return OutcomeSpace.of(issues)


def offer_at(scenario: Scenario, index: int) -> Offer:
    """The complete offer at flat outcome ``index`` of ``scenario``'s grid."""
    from nego.market.types import Offer  # scenarios sit below market: import the offer type only when asked

    return Offer(outcome_space(scenario.issues).values_at(index))


def index_of(scenario: Scenario, offer: Mapping[str, Value]) -> int:
    """Flat outcome index of ``offer`` (its values must lie on the grid)."""
    return outcome_space(scenario.issues).index_of(offer)


def utility_grid(prefs_contributions: list[np.ndarray]) -> np.ndarray:
    """Sum per-issue contribution vectors over the cartesian grid; returns a flat float64 array clipped to [0, 1]."""
    total = np.zeros((), dtype=np.float64)
    for k, vec in enumerate(prefs_contributions):
        shape = [1] * len(prefs_contributions)
        shape[k] = vec.size
        total = total + vec.reshape(shape)
    # Rounding to 12 decimals makes outcomes of mathematically equal utility tie exactly (float sums of the same
    # terms in another order differ in the last bits), so Pareto and Nash ties are decided by the maths.
    return np.clip(np.round(total, 12), 0.0, 1.0).ravel()


def compute_utilities(scenario: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Seller and buyer utility of every outcome (uncached; prefer :func:`utilities`)."""
    u_s = utility_grid(scenario.seller.grid_utilities(scenario.issues))
    u_b = utility_grid(scenario.buyer.grid_utilities(scenario.issues))
    return u_s, u_b


_CACHE: OrderedDict[tuple[str, Scenario], tuple[np.ndarray, np.ndarray]] = OrderedDict()
_CACHE_SIZE = 32


def utilities(scenario: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Seller and buyer utility of every outcome, as read-only flat arrays indexed like :func:`offer_at`.

    Results for the most recently used scenarios are cached (keyed by the scenario's full content).
    """
    key = (scenario.id, scenario)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    u_s, u_b = compute_utilities(scenario)
    u_s.setflags(write=False)
    u_b.setflags(write=False)
    _CACHE[key] = (u_s, u_b)
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return u_s, u_b


def pareto_mask(u_s: np.ndarray, u_b: np.ndarray) -> np.ndarray:
    """Boolean mask of outcomes on the Pareto frontier, one outcome (the lowest index) per distinct utility pair.

    An outcome is on the frontier when no other outcome is at least as good for both sides and better for one.
    Sorting by u_s descending (ties: u_b descending, then index ascending) makes a point non-dominated exactly
    when its u_b beats the running maximum of everything before it.
    """
    order = np.lexsort((np.arange(u_s.size), -u_b, -u_s))
    ub_sorted = u_b[order]
    best_before = np.maximum.accumulate(np.concatenate(([-np.inf], ub_sorted[:-1])))
    mask = np.zeros(u_s.size, dtype=bool)
    mask[order[ub_sorted > best_before]] = True
    return mask


@dataclass(frozen=True, slots=True, eq=False)
class ScenarioAnalysis:
    """What the outcome grid of a scenario looks like to an omniscient observer.

    ``pareto_utilities`` is a (k, 2) array of (u_seller, u_buyer) on the frontier, sorted by u_seller descending,
    and ``pareto_indices`` the outcome index of each point. ``nash_*`` describe the outcome maximising
    (u_s - rv_s) * (u_b - rv_b) over the zone of agreement (None when there is none). ``opposition`` is the
    distance from (1, 1) to the closest outcome, divided by the distance from (1, 1) to the zero-sum line
    u_s + u_b = 1, clipped to [0, 1]: 0 when one outcome gives both sides everything, 1 when the best outcome
    is no better than a zero-sum split.
    """

    scenario_id: str
    outcome_count: int
    pareto_utilities: np.ndarray
    pareto_indices: np.ndarray
    nash_index: int | None
    nash_utilities: tuple[float, float] | None
    nash_product: float
    max_joint_utility: float
    max_joint_index: int
    zopa: bool
    zopa_size: float
    opposition: float
    reservations: tuple[float, float]

    @property
    def pareto_size(self) -> int:
        return int(self.pareto_indices.size)


def analyse(scenario: Scenario) -> ScenarioAnalysis:
    """Exact analysis of ``scenario`` over its outcome grid."""
    u_s, u_b = utilities(scenario)
    return analyse_arrays(scenario.id, u_s, u_b, scenario.seller.reservation, scenario.buyer.reservation)


def analyse_arrays(scenario_id: str, u_s: np.ndarray, u_b: np.ndarray, rv_s: float, rv_b: float) -> ScenarioAnalysis:
    """The analysis of :func:`analyse`, from utility arrays and reservation values."""
    mask = pareto_mask(u_s, u_b)
    idx = np.flatnonzero(mask)
    idx = idx[np.lexsort((idx, -u_b[idx], -u_s[idx]))]
    frontier = np.column_stack((u_s[idx], u_b[idx]))
    in_zone = (u_s >= rv_s) & (u_b >= rv_b)
    zone_count = int(np.count_nonzero(in_zone))
    nash_index: int | None = None
    nash_utilities: tuple[float, float] | None = None
    nash_product = 0.0
    if zone_count:
        # Nash maximisers are Pareto optimal, so searching the frontier is exact and much smaller.
        front_zone = idx[in_zone[idx]]
        products = (u_s[front_zone] - rv_s) * (u_b[front_zone] - rv_b)
        best = int(front_zone[np.argmax(products)])
        nash_index = best
        nash_utilities = (float(u_s[nash_index]), float(u_b[nash_index]))
        nash_product = float(products.max())
    joint = u_s[idx] + u_b[idx]
    max_joint_index = int(idx[np.argmax(joint)])
    distance = float(np.min(np.hypot(1.0 - u_s[idx], 1.0 - u_b[idx])))
    return ScenarioAnalysis(
        scenario_id=scenario_id,
        outcome_count=int(u_s.size),
        pareto_utilities=frontier,
        pareto_indices=idx,
        nash_index=nash_index,
        nash_utilities=nash_utilities,
        nash_product=nash_product,
        max_joint_utility=float(joint.max()),
        max_joint_index=max_joint_index,
        zopa=zone_count > 0,
        zopa_size=zone_count / u_s.size,
        opposition=min(1.0, distance / _ZERO_SUM_DISTANCE),
        reservations=(float(rv_s), float(rv_b)),
    )
