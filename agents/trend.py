"""How the other side has been moving, measured in this side's own utility: what it has conceded since its first
offer and how its last offer moved from the one before. The compact protocol gives it as words (``c3 d1``), the
chat prompt as a sentence; both read it from here so they always tell a seller the same thing."""

from __future__ import annotations

from collections.abc import Sequence

from nego.market.types import ActionKind, PublicMove
from nego.scenarios.scenario import ScenarioView

MOVE_EDGES = (-0.01, 0.01, 0.03, 0.07)
"""Edges between the classes of a last move: took back, stalled, small, medium, large concession."""

MOVE_NAMES = ("took something back", "stalled", "conceded a little", "conceded", "conceded a lot")


def opponent_utilities(history: Sequence[PublicMove], view: ScenarioView) -> list[float]:
    """This side's utility of each offer the other side has made, in order."""
    return [
        view.utility(move.offer)
        for move in history
        if move.role is not view.role and move.kind is ActionKind.OFFER and move.offer is not None
    ]


def conceded(utilities: Sequence[float]) -> float:
    """What the other side has given up since its first offer (never negative)."""
    return max(0.0, utilities[-1] - utilities[0]) if utilities else 0.0


def move_class(utilities: Sequence[float]) -> int | None:
    """The class of the last move (an index of :data:`MOVE_NAMES`), None before the second offer."""
    if len(utilities) < 2:
        return None
    delta = utilities[-1] - utilities[-2]
    return sum(delta >= edge for edge in MOVE_EDGES)


def trend_sentence(history: Sequence[PublicMove], view: ScenarioView) -> str:
    """The chat prompt's line, empty until the other side has made two offers."""
    utilities = opponent_utilities(history, view)
    kind = move_class(utilities)
    if kind is None:
        return ""
    other = view.role.other.value
    delta = utilities[-1] - utilities[-2]
    return (
        f"Since its first offer the {other} has conceded {conceded(utilities):.2f} of your score; with its last offer "
        f"it {MOVE_NAMES[kind]} ({delta:+.2f})."
    )
