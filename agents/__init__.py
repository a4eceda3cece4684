"""Negotiators: the protocol every agent satisfies, the factory contract, and the spec registry.

The agents themselves live in rooms: ``rules`` (rule-based strategies), ``llm`` (chat-model negotiators, their
prompts, parsing and backends), ``remote`` (negotiators across HTTP) and ``compact`` (the tiny in-process seller).
"""

from nego.market.marketplace import NegotiatorFactory
from nego.market.protocol import Negotiator

from .registry import UnknownSpecError, known_specs, resolve

__all__ = ["Negotiator", "NegotiatorFactory", "UnknownSpecError", "known_specs", "resolve"]
