"""Fast exact search over one side's outcome space, for rule-based negotiators.

Rule-based agents keep asking "which outcome has the smallest own utility that is still at least x?". With
linear-additive utilities the answer needs no enumeration of the whole space: the issues are split into two
groups whose grids have similar sizes, the utility sums of each group are enumerated (a few hundred values
each even for 150,000 outcomes), one group's sums are sorted, and a single vectorised ``np.searchsorted``
finds, for every sum of the other group, the smallest partner that reaches x (meet in the middle). The
cheapest of those pairs is the exact answer.

An outcome is addressed by a pair ``(left, right)`` of flat indices into the two groups' grids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from nego.market.types import Offer
from nego.scenarios.issues import Issue, IssueKind, Value
from nego.scenarios.preferences import Preferences

Index = tuple[int, int]


def split_issues(sizes: Sequence[int]) -> tuple[list[int], list[int]]:
    """Positions of the issues in two groups whose grid-size products are as even as a greedy split gets."""
    left, right = _split(tuple(sizes))
    return list(left), list(right)


@lru_cache(maxsize=1024)
def _split(sizes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    left: list[int] = []
    right: list[int] = []
    pl = pr = 1
    for pos in sorted(range(len(sizes)), key=lambda p: -sizes[p]):
        if pl <= pr:
            left.append(pos)
            pl *= sizes[pos]
        else:
            right.append(pos)
            pr *= sizes[pos]
    return tuple(sorted(left)), tuple(sorted(right))


def _group_sums(contribs: Sequence[np.ndarray], group: Sequence[int]) -> np.ndarray:
    """Sum of per-issue contributions over every combination of the group's grid points (C order)."""
    if not group:
        return np.zeros(1)
    total = contribs[group[0]]  # 0.0 + x is x: the same sums as starting from zero
    for pos in group[1:]:
        total = np.add.outer(total, contribs[pos]).ravel()
    return total


@dataclass(frozen=True, slots=True)
class Candidates:
    """For each left index, the right partner with the smallest total utility reaching a target."""

    left: np.ndarray
    right: np.ndarray
    utility: np.ndarray


class OutcomeSpace:
    """One side's utilities over the grid outcomes of a scenario, with exact nearest-above queries.

    Built once per negotiation (cost ~ the sum, not the product, of the two groups' sizes).
    """

    def __init__(self, issues: tuple[Issue, ...], preferences: Preferences) -> None:
        self.issues = issues
        grids = [issue.grid() for issue in issues]
        names = [issue.name for issue in issues]
        self._left, self._right = _split(tuple(len(g) for g in grids))
        contribs = preferences.grid_utilities(issues)
        self._a = _group_sums(contribs, self._left)
        b = _group_sums(contribs, self._right)
        self._order = np.argsort(b, kind="stable")
        self._bs = b[self._order]
        self._bs_inf = np.append(self._bs, np.inf)  # sentinel: searchsorted past the end reads +inf
        self._b = b
        self._names = names
        self._grids = grids
        self._score = preferences.scorer(issues)
        self._seen: dict[int, tuple[Offer, float]] = {}
        ia, ib = int(np.argmax(self._a)), int(np.argmax(b))
        self.best_index: Index = (ia, ib)
        self.best = float(self._a[ia] + b[ib])
        self.worst = float(self._a.min() + self._bs[0])
        self._floor_cache: tuple[float, np.ndarray, np.ndarray] | None = None
        self._offers: dict[Index, Offer] = {}
        self._grid_valid = all(issue.grid_is_valid() for issue in issues)
        # per group, (issue position, grid size, grid) from the fastest-varying issue of its flat index to the slowest
        self._decode = tuple(
            tuple((pos, len(grids[pos]), grids[pos]) for pos in reversed(group)) for group in (self._left, self._right)
        )

    @property
    def size(self) -> int:
        return len(self._a) * len(self._b)

    def utility(self, index: Index) -> float:
        """Own utility of an outcome, as the sum of its two groups' contributions."""
        return float(self._a[index[0]] + self._b[index[1]])

    def offer(self, index: Index) -> Offer:
        """The outcome at ``index`` as an offer; the same object each time it is asked for."""
        offer = self._offers.get(index)
        if offer is None:
            offer = self._offers[index] = self._make_offer(index)
        return offer

    def _make_offer(self, index: Index) -> Offer:
        values: list[Value] = [0] * len(self._names)
        for flat, plan in zip(index, self._decode, strict=True):
            for pos, size, grid in plan:
                flat, k = divmod(flat, size)
                values[pos] = grid[k]
        ordered = dict(zip(self._names, values, strict=True))
        return Offer.known_valid(ordered, self.issues) if self._grid_valid else Offer(ordered)

    def utility_of(self, offer: Mapping[str, Value]) -> float:
        """Own utility of any complete offer; bit-for-bit equal to ``Preferences.utility`` (its scorer: same terms,
        same order)."""
        if type(offer) is not Offer:
            return self._score(offer)
        seen = self._seen.get(id(offer))
        if seen is not None:
            return seen[1]
        u = self._score(offer)
        self._seen[id(offer)] = (offer, u)  # keeps the offer alive, so its id is not reused meanwhile
        return u

    def candidates(self, target: float) -> Candidates:
        """Per left index, the cheapest right partner whose total reaches ``target`` (left indices without one are
        dropped)."""
        j = np.searchsorted(self._bs, target - self._a, side="left")
        ok = j < len(self._bs)
        left = np.flatnonzero(ok)
        js = j[ok]
        return Candidates(left, self._order[js], self._a[left] + self._bs[js])

    def at_least(self, target: float) -> Index | None:
        """The outcome with the smallest own utility >= ``target``, or None if no outcome reaches it."""
        j = self._bs.searchsorted(target - self._a)
        tot = self._a + self._bs_inf[j]
        i = int(tot.argmin())
        if tot[i] == np.inf:
            return None
        return i, int(self._order[j[i]])

    def count_at_least(self, floor: float) -> int:
        return int(self._floor_counts(floor)[1][-1])

    def sample_at_least(self, floor: float, rng: np.random.Generator) -> Index | None:
        """An outcome drawn uniformly from those with own utility >= ``floor`` (None if there are none)."""
        starts, cum = self._floor_counts(floor)
        total = int(cum[-1])
        if total == 0:
            return None
        r = int(rng.integers(total))
        i = int(np.searchsorted(cum, r, side="right"))
        before = int(cum[i - 1]) if i else 0
        return i, int(self._order[int(starts[i]) + r - before])

    def _floor_counts(self, floor: float) -> tuple[np.ndarray, np.ndarray]:
        if self._floor_cache is None or self._floor_cache[0] != floor:
            starts = np.searchsorted(self._bs, floor - self._a, side="left")
            self._floor_cache = (floor, starts, np.cumsum(len(self._bs) - starts))
        return self._floor_cache[1], self._floor_cache[2]

    def group_sums(self, contribs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Sums of other per-issue contributions (e.g. an estimated opponent utility) over the same two groups,
        indexed like :meth:`offer`'s indices."""
        return _group_sums(contribs, self._left), _group_sums(contribs, self._right)

    def grid_position(self, issue_pos: int, value: Value) -> int | None:
        """Index of ``value`` on the issue's grid (nearest grid point for numbers; None if not on it)."""
        issue = self.issues[issue_pos]
        if issue.kind is IssueKind.CATEGORICAL:
            return issue.options.index(value) if value in issue.options else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        k = round((float(value) - issue.low) / issue.step)
        return k if 0 <= k < issue.size else None
