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
from nego.market.types import Action, ActionKind, Offer
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


class _Layout:
    """What every outcome space over one issues tuple shares: the grids, the split into two groups, how a flat
    index decodes into values, and the offers decoded so far (an index names the same outcome in all of them)."""

    MAX_OFFERS = 1 << 14
    """Decoded offers (and offer actions) kept; past it the table starts again. With ``_MAX_LAYOUTS`` this bounds
    what the tables hold to a few hundred thousand small objects, whatever a long market plays."""

    def __init__(self, issues: tuple[Issue, ...]) -> None:
        self.issues = issues
        self.names = [issue.name for issue in issues]
        self.grids = [issue.grid() for issue in issues]
        self.left, self.right = _split(tuple(len(g) for g in self.grids))
        self.grid_valid = all(issue.grid_is_valid() for issue in issues)
        # per group, (issue position, grid size, grid) from the fastest-varying issue of its flat index to the slowest
        self.decode = tuple(
            tuple((pos, len(self.grids[pos]), self.grids[pos]) for pos in reversed(group))
            for group in (self.left, self.right)
        )
        self.offers: dict[Index, Offer] = {}
        self.actions: dict[Index, Action] = {}

    def __deepcopy__(self, memo: dict) -> _Layout:
        return self  # shared by every space over its issues tuple: a copied negotiator shares it too

    def offer_action(self, index: Index) -> Action:
        action = self.actions.get(index)
        if action is None:
            if len(self.actions) >= self.MAX_OFFERS:
                self.actions.clear()
            action = self.actions[index] = Action(ActionKind.OFFER, self.offer(index))
        return action

    def offer(self, index: Index) -> Offer:
        offer = self.offers.get(index)
        if offer is None:
            values: list[Value] = [0] * len(self.names)
            for flat, plan in zip(index, self.decode, strict=True):
                for pos, size, grid in plan:
                    flat, k = divmod(flat, size)
                    values[pos] = grid[k]
            ordered = dict(zip(self.names, values, strict=True))
            offer = Offer.known_valid(ordered, self.issues) if self.grid_valid else Offer(ordered)
            if len(self.offers) >= self.MAX_OFFERS:
                self.offers.clear()
            self.offers[index] = offer
        return offer


_LAYOUTS: dict[int, _Layout] = {}
_MAX_LAYOUTS = 16


def _layout(issues: tuple[Issue, ...]) -> _Layout:
    """The layout of this issues tuple, kept by the tuple's identity (the layout holds the tuple, so its id is not
    reused meanwhile); a full table starts again (one atomic clear: safe beside other threads)."""
    layout = _LAYOUTS.get(id(issues))
    if layout is not None and layout.issues is issues:
        return layout
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    layout = _LAYOUTS[id(issues)] = _Layout(issues)
    return layout


@dataclass(frozen=True, slots=True)
class Candidates:
    """For each left index, the right partner with the smallest total utility reaching a target."""

    left: np.ndarray
    right: np.ndarray
    utility: np.ndarray


_MAX_SEEN = 1 << 14
"""Offers an outcome space remembers (scored, or decoded by index) before it starts again."""


class OutcomeSpace:
    """One side's utilities over the grid outcomes of a scenario, with exact nearest-above queries.

    Built once per issues tuple and preferences object (cost ~ the sum, not the product, of the two groups' sizes) and
    shared by the negotiators that use them (:func:`shared_space`): what it holds besides the utilities are caches.
    """

    def __init__(self, issues: tuple[Issue, ...], preferences: Preferences) -> None:
        self.issues = issues
        self._layout = layout = _layout(issues)
        contribs = preferences.grid_utilities(issues)
        self._a = a = _group_sums(contribs, layout.left)
        self._b = b = _group_sums(contribs, layout.right)
        self._order = np.argsort(b, kind="stable")
        n = len(b)
        self._bs_inf = np.empty(n + 1)  # b sorted, then a sentinel: searchsorted past the end reads +inf
        np.take(b, self._order, out=self._bs_inf[:n])
        self._bs_inf[n] = np.inf
        self._bs = self._bs_inf[:n]
        self._score = preferences.scorer(issues)
        self._seen: dict[int, tuple[Offer, float]] = {}
        ia, ib = int(a.argmax()), int(b.argmax())
        self.best_index: Index = (ia, ib)
        self.best = float(a[ia] + b[ib])
        self.worst = float(a.min() + self._bs[0])
        self._floor_cache: tuple[float, np.ndarray, np.ndarray] | None = None
        self._offers: dict[Index, Offer] = {}

    def __deepcopy__(self, memo: dict) -> OutcomeSpace:
        return self  # shared (see :func:`shared_space`): a copied negotiator uses the same space

    @property
    def size(self) -> int:
        return len(self._a) * len(self._b)

    def utility(self, index: Index) -> float:
        """Own utility of an outcome, as the sum of its two groups' contributions."""
        return float(self._a[index[0]] + self._b[index[1]])

    def offer(self, index: Index) -> Offer:
        """The outcome at ``index`` as an offer (the layout's: the same object while its table holds it)."""
        offer = self._offers.get(index)
        if offer is None:
            if len(self._offers) >= _MAX_SEEN:
                self._offers.clear()
            offer = self._offers[index] = self._layout.offer(index)
        return offer

    def offer_action(self, index: Index) -> Action:
        """An action offering the outcome at ``index`` (with no message), shared like the offer it holds."""
        return self._layout.offer_action(index)

    def utility_of(self, offer: Mapping[str, Value]) -> float:
        """Own utility of any complete offer; bit-for-bit equal to ``Preferences.utility`` (its scorer: same terms,
        same order)."""
        if type(offer) is not Offer:
            return self._score(offer)
        seen = self._seen.get(id(offer))
        if seen is not None:
            return seen[1]
        u = self._score(offer.as_mapping())
        if len(self._seen) >= _MAX_SEEN:  # a space serves many negotiations: what it remembers stays bounded
            self._seen.clear()
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

    def at_least_many(self, targets: Sequence[float]) -> list[Index | None]:
        """:meth:`at_least` of each target, in one vectorised pass: the same answers, element by element."""
        j = self._bs.searchsorted(np.subtract.outer(np.array(targets, dtype=float), self._a))
        tot = self._bs_inf.take(j)
        tot += self._a  # the same sums as a + b (addition commutes exactly)
        best = tot.argmin(axis=1)
        rows = np.arange(len(best))
        found = (tot[rows, best] != np.inf).tolist()
        rights = self._order[np.minimum(j[rows, best], len(self._bs) - 1)].tolist()  # past the end: not found
        return [(i, r) if ok else None for i, r, ok in zip(best.tolist(), rights, found, strict=True)]

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
        return _group_sums(contribs, self._layout.left), _group_sums(contribs, self._layout.right)

    def grid_position(self, issue_pos: int, value: Value) -> int | None:
        """Index of ``value`` on the issue's grid (nearest grid point for numbers; None if not on it)."""
        issue = self.issues[issue_pos]
        if issue.kind is IssueKind.CATEGORICAL:
            return issue.options.index(value) if value in issue.options else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        k = round((float(value) - issue.low) / issue.step)
        return k if 0 <= k < issue.size else None


_SPACES: dict[tuple[int, int], tuple[tuple[Issue, ...], Preferences, OutcomeSpace]] = {}
_MAX_SPACES = 64


def shared_space(issues: tuple[Issue, ...], preferences: Preferences) -> OutcomeSpace:
    """The outcome space of ``preferences`` over ``issues``, made once for this issues tuple and preferences object
    (both immutable) and shared by every negotiator that asks: the negotiations of a scenario, played again and again
    in an evaluation, a market day or the replays of an optimality gap, build it once. Kept by the objects' identities
    (the entry holds both, so their ids are not reused meanwhile); a full table starts again."""
    key = (id(issues), id(preferences))
    hit = _SPACES.get(key)
    if hit is not None and hit[0] is issues and hit[1] is preferences:
        return hit[2]
    if len(_SPACES) >= _MAX_SPACES:
        _SPACES.clear()
    space = OutcomeSpace(issues, preferences)
    _SPACES[key] = (issues, preferences, space)
    return space
