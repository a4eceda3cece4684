"""How a deal changes the population: the settlement rule.

A deal moves ``units`` from seller to buyer, where ``units`` is the agreed value of an issue named ``quantity`` (or
``units``/``volume``/``qty``) if the scenario has one, else 1, capped by the seller's inventory and the buyer's
demand. If the scenario has an issue named ``price`` (or ending in ``_price``) it is read as a unit price: the buyer
pays ``units * price``, and buys fewer units when its budget does not cover them. Without a price issue, goods
change hands but no money is counted. Kept deliberately simple.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nego.scenarios.scenario import Scenario

from .types import Offer

if TYPE_CHECKING:
    from .population import BuyerAgent, SellerAgent

QUANTITY_ISSUES = ("quantity", "units", "volume", "qty")


@dataclass(frozen=True, slots=True)
class Settlement:
    """What one deal changed: units moved and money paid (both 0 when the buyer could not afford a unit)."""

    units: int
    price: float | None
    paid: float


def check_tradeable(scenario: Scenario) -> None:
    """Raise ValueError unless deals on ``scenario`` can be settled: a quantity or price issue must not admit
    negative values (settling one would add stock to the seller and take money from it)."""
    for issue in scenario.issues:
        tradeable = issue.name in QUANTITY_ISSUES or issue.name == "price" or issue.name.endswith("_price")
        if tradeable and issue.low is not None and issue.low < 0:
            raise ValueError(
                f"scenario {scenario.id!r}: issue {issue.name!r} admits {issue.low} < 0, which the market cannot "
                f"settle; give it low >= 0"
            )


def _find_issue(offer: Offer, names: Sequence[str], suffix: str | None = None) -> float | None:
    for key, value in offer.items():
        if (key in names or (suffix and key.endswith(suffix))) and not isinstance(value, str):
            return float(value)
    return None


def settle(seller: SellerAgent, buyer: BuyerAgent, agreement: Offer) -> Settlement:
    """Apply one deal to both agents according to the module's settlement rule."""
    wanted = _find_issue(agreement, QUANTITY_ISSUES)
    units = min(int(wanted) if wanted is not None else 1, seller.inventory, buyer.demand)
    price = _find_issue(agreement, ("price",), "_price")
    if price is not None and price > 0 and units * price > buyer.budget:
        units = int(buyer.budget // price)
    paid = units * price if price is not None else 0.0
    seller.inventory -= units
    seller.sold += units
    seller.revenue += paid
    buyer.demand -= units
    buyer.bought += units
    buyer.budget -= paid
    buyer.spent += paid
    return Settlement(units, price, paid)
