"""The population model's statistics: one typed row per market day and one per seller spec per day, and the table
of its agents' state.

Rows are frozen dataclasses while the model runs; :func:`frame` turns them into a Polars table at the edge, with the
row type's schema (:data:`DAY_SCHEMA`, :data:`SELLER_DAY_SCHEMA`).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from .rates import invalid_per_move_of
from .types import EndReason, Outcome

if TYPE_CHECKING:
    from .marketplace import Played
    from .population import BuyerAgent, SellerAgent
    from .settlement import Settlement


@dataclass(frozen=True, slots=True)
class DayRow:
    """One market day: pairs matched, how their negotiations ended, what was settled and what is left."""

    day: int
    pairs: int
    deals: int
    no_deals: int
    errors: int
    units: int
    revenue: float
    mean_seller_utility: float | None
    mean_buyer_utility: float | None
    inventory_left: int
    demand_left: int


@dataclass(frozen=True, slots=True)
class SellerDayRow:
    """How one seller spec's negotiations of one day went (a learner's rollouts included; its policy version is the
    one that played)."""

    day: int
    seller: str
    negotiations: int
    deals: int
    errors: int
    mean_seller_utility: float | None
    invalid_per_turn: float | None
    learning: bool
    policy_version: int | None


DAY_SCHEMA = pl.Schema(
    {
        "day": pl.Int32,
        "pairs": pl.Int32,
        "deals": pl.Int32,
        "no_deals": pl.Int32,
        "errors": pl.Int32,
        "units": pl.Int64,
        "revenue": pl.Float64,
        "mean_seller_utility": pl.Float64,
        "mean_buyer_utility": pl.Float64,
        "inventory_left": pl.Int64,
        "demand_left": pl.Int64,
    }
)
"""The table of :class:`DayRow` s."""

SELLER_DAY_SCHEMA = pl.Schema(
    {
        "day": pl.Int32,
        "seller": pl.String,
        "negotiations": pl.Int32,
        "deals": pl.Int32,
        "errors": pl.Int32,
        "mean_seller_utility": pl.Float64,
        "invalid_per_turn": pl.Float64,
        "learning": pl.Boolean,
        "policy_version": pl.Int32,
    }
)
"""The table of :class:`SellerDayRow` s."""


def frame(rows: Sequence[DayRow] | Sequence[SellerDayRow], schema: pl.Schema) -> pl.DataFrame:
    """Rows as a table with ``schema``, whose column names are the rows' field names."""
    return pl.DataFrame({name: [getattr(r, name) for r in rows] for name in schema}, schema=schema)


def day_row(
    day: int,
    outcomes: Sequence[Outcome],
    settlements: Sequence[Settlement | None],
    inventory_left: int,
    demand_left: int,
) -> DayRow:
    """The row of a day whose pairs ended in ``outcomes`` and whose deals were settled as ``settlements`` (None for
    a pair without a settled deal), both in pair order."""
    units, revenue, deals, errors = 0, 0.0, 0, 0
    utilities: list[tuple[float, float]] = []
    for o, done in zip(outcomes, settlements, strict=True):
        if o.end_reason is EndReason.ERROR:
            errors += 1
            continue
        utilities.append((o.seller_utility, o.buyer_utility))
        if done is not None:
            deals += 1
            units, revenue = units + done.units, revenue + done.paid
    mean = np.mean(utilities, axis=0) if utilities else (None, None)
    return DayRow(
        day=day,
        pairs=len(outcomes),
        deals=deals,
        no_deals=len(outcomes) - deals - errors,
        errors=errors,
        units=units,
        revenue=revenue,
        mean_seller_utility=None if mean[0] is None else float(mean[0]),
        mean_buyer_utility=None if mean[1] is None else float(mean[1]),
        inventory_left=inventory_left,
        demand_left=demand_left,
    )


def seller_day_rows(day: int, groups: Sequence[list[Played]], learning: Container[str]) -> list[SellerDayRow]:
    """Per seller spec, in order of first appearance: its row for the day whose played ``groups`` (a pair's
    negotiations, the market's own first) are given; ``learning`` holds the specs traded by learners."""
    by_spec: dict[str, list[Played]] = {}
    for g in groups:
        by_spec.setdefault(g[0].job.seller, []).extend(g)
    rows = []
    for spec, items in by_spec.items():
        ok = [p for p in items if p.result.outcome.end_reason is not EndReason.ERROR]
        learner = spec in learning
        rows.append(
            SellerDayRow(
                day=day,
                seller=spec,
                negotiations=len(items),
                deals=sum(p.result.outcome.agreed for p in ok),
                errors=len(items) - len(ok),
                mean_seller_utility=float(np.mean([p.result.outcome.seller_utility for p in ok])) if ok else None,
                invalid_per_turn=invalid_per_move_of(p.result for p in ok),
                learning=learner,
                policy_version=items[0].job.policy_version if learner else None,
            )
        )
    return rows


AGENT_SCHEMA = pl.Schema(
    {"id": pl.Int64, "side": pl.String, "spec": pl.String, "stock": pl.Int64, "units": pl.Int64, "money": pl.Float64}
)
"""One agent's state: stock is a seller's inventory or a buyer's demand left; units and money sold or bought."""


def agents_frame(sellers: Sequence[SellerAgent], buyers: Sequence[BuyerAgent]) -> pl.DataFrame:
    """Every agent's current state, one row each, sellers first."""
    rows = [(s.unique_id, "seller", s.spec, s.inventory, s.sold, s.revenue) for s in sellers]
    rows += [(b.unique_id, "buyer", b.spec, b.demand, b.bought, b.spent) for b in buyers]
    return pl.DataFrame(rows, schema=AGENT_SCHEMA, orient="row")
