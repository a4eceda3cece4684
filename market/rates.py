"""Deal and invalid-action rates, each defined once, with its denominator in its name.

Every table, log and report that shows one of these rates computes it here, so that a number under one name means
one thing in ``nego simulate``'s tables and live view, the training log, the dev evaluations of ``nego train`` and
``nego eval``:

- **deal rate**: deals per negotiation.
- **invalid per move**: one side's invalid moves per move that side attempted. A move is one attempt, one
  :class:`~nego.market.types.Turn` of the transcript: a retry after an invalid move is a move of its own, so a turn
  forfeited after ``1 + max_retries`` invalid attempts counts that many moves, all invalid. Over several negotiations
  it is pooled (all invalid moves over all moves), so a negotiation weighs as many moves as it had.
- **invalid per negotiation**: one side's invalid moves per negotiation, a count that may exceed 1.

Which negotiations a rate covers is the caller's choice, said where the rate is shown (the simulate summaries leave
negotiations that ended in an error out of the deal rate, since an error is neither a deal nor a no-deal, but count
the moves made before it; a dev evaluation counts an error as a no-deal). Each rate comes from counts (for running
totals), over outcomes or results, and, where tables are Polars, as an expression over a negotiations table (the
columns of :data:`~nego.market.transcript_rows.NEGOTIATIONS_SCHEMA`). With nothing to divide by, each gives None
(null in Polars).

``nego eval``'s per-negotiation ``invalid_rate`` (:mod:`nego.evaluation.metrics`) is invalid per move within one
negotiation; its mean over negotiations weighs each negotiation alike, unlike the pooled rate here.
"""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl
from nego.scenarios.scenario import Role

from .types import NegotiationResult, Outcome


def deal_rate(deals: int, negotiations: int) -> float | None:
    """Deals per negotiation; None without negotiations."""
    return deals / negotiations if negotiations else None


def invalid_per_move(invalid: int, moves: int) -> float | None:
    """Invalid moves per attempted move (one side's); None without moves."""
    return invalid / moves if moves else None


def invalid_per_negotiation(invalid: int, negotiations: int) -> float | None:
    """Invalid moves (one side's) per negotiation; None without negotiations."""
    return invalid / negotiations if negotiations else None


def moves(result: NegotiationResult, role: Role = Role.SELLER) -> int:
    """The moves ``role`` attempted in one negotiation: its turns in the transcript, invalid attempts included."""
    return sum(1 for t in result.turns if t.role is role)


def invalid_moves(outcome: Outcome, role: Role = Role.SELLER) -> int:
    """The invalid moves ``role`` made in one negotiation."""
    return outcome.invalid_seller if role is Role.SELLER else outcome.invalid_buyer


def deal_rate_of(outcomes: Iterable[Outcome]) -> float | None:
    """Deals per negotiation over ``outcomes`` (each one a negotiation)."""
    agreed = [o.agreed for o in outcomes]
    return deal_rate(sum(agreed), len(agreed))


def invalid_per_move_of(results: Iterable[NegotiationResult], role: Role = Role.SELLER) -> float | None:
    """Invalid moves of ``role`` per move of ``role``, pooled over ``results``."""
    invalid = made = 0
    for r in results:
        invalid += invalid_moves(r.outcome, role)
        made += moves(r, role)
    return invalid_per_move(invalid, made)


def invalid_per_negotiation_of(outcomes: Iterable[Outcome], role: Role = Role.SELLER) -> float | None:
    """Invalid moves of ``role`` per negotiation over ``outcomes``."""
    counts = [invalid_moves(o, role) for o in outcomes]
    return invalid_per_negotiation(sum(counts), len(counts))


def deal_rate_expr(where: pl.Expr | None = None, column: str = "agreed") -> pl.Expr:
    """Deals per negotiation of a table with one row per negotiation and a boolean ``column`` (``agreed`` in the
    transcripts, ``deal`` in the evaluation metrics), over the rows ``where`` holds (all rows if None); null without
    rows."""
    agreed = pl.col(column) if where is None else pl.col(column).filter(where)
    return agreed.cast(pl.Float64).mean()


def invalid_per_move_expr(role: Role = Role.SELLER) -> pl.Expr:
    """Invalid moves of ``role`` per move of ``role``, pooled over the rows of a negotiations table (its
    ``invalid_ROLE`` and ``turns_ROLE`` columns); null without moves."""
    made = pl.col(f"turns_{role.value}").sum()
    return pl.when(made > 0).then(pl.col(f"invalid_{role.value}").sum() / made)
