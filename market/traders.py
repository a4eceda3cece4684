"""The traders of the population model: sellers and buyers as Mesa agents, and the setups they start from.

A deal changes them by the rule of :mod:`.settlement`; the :class:`~nego.market.population.MarketModel` matches them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mesa

if TYPE_CHECKING:
    from .population import MarketModel


@dataclass(frozen=True, slots=True)
class SellerSetup:
    """A seller at the start of a simulation."""

    spec: str
    inventory: int
    unit_cost: float = 0.0


@dataclass(frozen=True, slots=True)
class BuyerSetup:
    """A buyer at the start of a simulation; ``budget`` is spent on priced deals only."""

    spec: str
    demand: int
    budget: float = math.inf


class SellerAgent(mesa.Agent):
    """A seller: negotiates with its spec's agents while it has inventory."""

    def __init__(self, model: MarketModel, setup: SellerSetup) -> None:
        super().__init__(model)
        self.spec = setup.spec
        self.inventory = setup.inventory
        self.unit_cost = setup.unit_cost
        self.sold = 0
        self.revenue = 0.0

    @property
    def profit(self) -> float:
        return self.revenue - self.sold * self.unit_cost


class BuyerAgent(mesa.Agent):
    """A buyer: negotiates while it has demand and budget left."""

    def __init__(self, model: MarketModel, setup: BuyerSetup) -> None:
        super().__init__(model)
        self.spec = setup.spec
        self.demand = setup.demand
        self.budget = setup.budget
        self.bought = 0
        self.spent = 0.0
