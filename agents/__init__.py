"""Negotiators: the protocol every agent satisfies, the rule-based strategies, and the spec registry."""

from nego.market.protocol import Negotiator

from .registry import NegotiatorFactory, UnknownSpecError, known_specs, resolve

__all__ = ["Negotiator", "NegotiatorFactory", "UnknownSpecError", "known_specs", "resolve"]
