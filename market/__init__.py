"""The market: the negotiation protocol, the concurrent marketplace, transcripts, summaries and the population model.

``MarketModel`` and the other population names are loaded on first use, so that importing the market does not
import Mesa (and pandas) for runs that never use the population model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .events import (
    DayEnded,
    DayStarted,
    EndKind,
    EventBus,
    NegotiationEnded,
    NegotiationStarted,
    RunFinished,
    TurnPlayed,
)
from .marketplace import Job, Marketplace, NegotiatorFactory, run_jobs
from .protocol import Negotiator, ProtocolConfig, run_negotiation
from .summary import RunningStats, summarize
from .transcript_rows import SCHEMA_VERSION
from .transcripts import TranscriptWriter, load_results, read_negotiations, read_turns

if TYPE_CHECKING:
    from .population import BuyerSetup, MarketModel, SellerSetup

_LAZY = ("BuyerSetup", "MarketModel", "SellerSetup")

__all__ = [
    "SCHEMA_VERSION",
    "BuyerSetup",
    "DayEnded",
    "DayStarted",
    "EndKind",
    "EventBus",
    "Job",
    "MarketModel",
    "Marketplace",
    "NegotiationEnded",
    "NegotiationStarted",
    "Negotiator",
    "NegotiatorFactory",
    "ProtocolConfig",
    "RunFinished",
    "RunningStats",
    "SellerSetup",
    "TranscriptWriter",
    "TurnPlayed",
    "load_results",
    "read_negotiations",
    "read_turns",
    "run_jobs",
    "run_negotiation",
    "summarize",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import population

        return getattr(population, name)
    raise AttributeError(f"module 'nego.market' has no attribute {name!r}")
