"""The market: the negotiation protocol, the concurrent marketplace, transcripts, summaries and the population model.

``MarketModel`` and the other population names are loaded on first use, so that importing the market does not
import Mesa (and pandas) for runs that never use the population model; so are the transcripts and summaries, so that
a process that only plays (a worker) does not import Polars.
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

if TYPE_CHECKING:
    from .population import BuyerSetup, MarketModel, SellerSetup
    from .summary import RunningStats, summarize
    from .transcript_rows import SCHEMA_VERSION
    from .transcripts import TranscriptWriter, load_results, read_negotiations, read_turns

_LAZY = {
    "BuyerSetup": "population",
    "MarketModel": "population",
    "SellerSetup": "population",
    "RunningStats": "summary",
    "summarize": "summary",
    "SCHEMA_VERSION": "transcript_rows",
    "TranscriptWriter": "transcripts",
    "load_results": "transcripts",
    "read_negotiations": "transcripts",
    "read_turns": "transcripts",
}

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
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'nego.market' has no attribute {name!r}")
