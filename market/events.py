"""Market events and a small synchronous event bus: how live views and statistics watch a run.

Publishers check :attr:`EventBus.active` before building an event, so a run nobody watches pays nothing.
A failing subscriber is logged and counted; it never stops the market.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .types import EndReason, NegotiationResult, Turn

if TYPE_CHECKING:
    from .learning import LearnReport
    from .marketplace import Job

logger = logging.getLogger(__name__)


class EndKind(StrEnum):
    """How a negotiation ended, for counting: an error is neither a deal nor a no-deal."""

    DEAL = "deal"
    NO_DEAL = "no_deal"
    ERROR = "error"

    @staticmethod
    def of(result: NegotiationResult) -> EndKind:
        reason = result.outcome.end_reason
        if reason is EndReason.ERROR:
            return EndKind.ERROR
        return EndKind.DEAL if reason is EndReason.AGREEMENT else EndKind.NO_DEAL


@dataclass(frozen=True, slots=True)
class NegotiationStarted:
    """A negotiation got its concurrency slots and its agents are about to play."""

    job: Job
    attempt: int


@dataclass(frozen=True, slots=True)
class TurnPlayed:
    """One attempted move. ``standing_*`` are both utilities of the offer on the table after this turn
    (None while nothing is on the table)."""

    negotiation_id: str
    turn: Turn
    standing_seller: float | None
    standing_buyer: float | None


@dataclass(frozen=True, slots=True)
class NegotiationEnded:
    """A negotiation finished (deal, no deal, or error) after ``wall_s`` seconds."""

    job: Job
    attempt: int
    result: NegotiationResult
    wall_s: float

    @property
    def kind(self) -> EndKind:
        return EndKind.of(self.result)


@dataclass(frozen=True, slots=True)
class DayStarted:
    """A market day of the population model begins with ``pairs`` matched seller-buyer pairs."""

    day: int
    pairs: int


@dataclass(frozen=True, slots=True)
class DayEnded:
    """A market day ended: negotiated deals, settled units and revenue, errors."""

    day: int
    negotiations: int
    deals: int
    errors: int
    units: int
    revenue: float


@dataclass(frozen=True, slots=True)
class RunFinished:
    """A marketplace run ended: ``ran`` negotiations played now, ``skipped`` already complete on disk."""

    jobs: int
    ran: int
    skipped: int
    errors: int
    wall_s: float


Event = NegotiationStarted | TurnPlayed | NegotiationEnded | DayStarted | DayEnded | RunFinished
Subscriber = Callable[[Any], None]


class EventBus:
    """Synchronous fan-out of events to subscribers, in subscription order.

    Subscribers run inside the market's event loop, so they must be quick (render later, not here).
    """

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self.errors = 0
        """Number of exceptions raised by subscribers so far."""

    @property
    def active(self) -> bool:
        """True if anyone listens; publishers skip building events otherwise."""
        return bool(self._subscribers)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every published event; returns a function that unsubscribes."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def publish(self, event: Event) -> None:
        for callback in tuple(self._subscribers):
            try:
                callback(event)
            except Exception:
                self.errors += 1
                # the first failure carries its traceback; later ones only a count, to keep logs readable
                logger.warning(
                    "event subscriber %r failed on %s (%d subscriber errors so far)",
                    callback,
                    type(event).__name__,
                    self.errors,
                    exc_info=self.errors == 1,
                )


@dataclass(frozen=True, slots=True)
class LearnerUpdated:
    """A learner learned from a day's negotiations (see :mod:`nego.market.learning`)."""

    day: int
    spec: str
    report: LearnReport
