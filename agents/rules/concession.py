"""The other side's offers measured in own utility: the signal that the reacting negotiators read.

A negotiator that reacts to how much the other side concedes needs the same three things: the own utility of each
offer the other side has made, the gain each offer brings, and a trend that weighs recent offers most.

A gain is measured against the best offer so far, not against the previous one: a side that retreats and then
comes back to where it was has conceded nothing new, so alternating between two offers earns no reciprocity.
"""

from __future__ import annotations

import numpy as np
from nego.market.types import Observation

from .base import opponent_offers
from .search import OutcomeSpace


class OpponentOffers:
    """Own utilities of the other side's offers in this negotiation, oldest first, read incrementally."""

    def __init__(self, space: OutcomeSpace) -> None:
        self.space = space
        self.utilities: list[float] = []

    def update(self, obs: Observation) -> list[float]:
        """Read the offers made since the last call; returns their gains, one per new offer that has a predecessor:
        the offer's own utility minus the best own utility among the other side's earlier offers (at most 0 for an
        offer that breaks no new ground, negative for one worse than the best so far)."""
        theirs = opponent_offers(obs)
        u = self.utilities
        before = len(u)
        u.extend(self.space.utility_of(o) for o in theirs[before:])
        gains = []
        best = max(u[:before], default=None)
        for value in u[before:]:
            if best is not None:
                gains.append(value - best)
            best = value if best is None else max(best, value)
        return gains


def weighted_trend(values: list[float], memory: float) -> tuple[float, float]:
    """(level, slope) of a weighted least-squares line through ``values`` against their position, where the
    value ``k`` places back from the newest weighs ``memory ** k``; level is the line's value at the newest position.

    One value gives slope 0. ``memory`` must lie in (0, 1]; 1 weighs every value equally.
    """
    if not values:
        raise ValueError("weighted_trend needs at least one value")
    y = np.asarray(values, dtype=float)
    n = len(y)
    if n == 1:
        return float(y[0]), 0.0
    x = np.arange(n, dtype=float) - (n - 1)
    w = memory ** (-x)
    xm = float(np.dot(w, x) / w.sum())
    ym = float(np.dot(w, y) / w.sum())
    sxx = float(np.dot(w, (x - xm) ** 2))
    slope = float(np.dot(w, (x - xm) * (y - ym)) / sxx) if sxx > 0 else 0.0
    return ym - slope * xm, slope
