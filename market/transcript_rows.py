"""What one transcript row is: the Parquet schemas of the negotiations and turns tables, and the conversions
between a :class:`NegotiationResult` and its rows in both directions (written by
:class:`~nego.market.transcripts.TranscriptWriter`, read back on resume and by evaluations)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl
from nego.scenarios.scenario import Role

from .marketplace import scenario_hash
from .types import KIND_OF, ROLE_OF, Action, ActionKind, EndReason, NegotiationResult, Offer, Outcome, Turn, Usage

if TYPE_CHECKING:
    from .marketplace import Job

SCHEMA_VERSION = 2
"""2 added the learner columns (step, group, policy_version, reward); parts of version 1 read with them null."""

ROLE = pl.Enum([r.value for r in Role])
END_REASON = pl.Enum([r.value for r in EndReason])
ACTION_KIND = pl.Enum([k.value for k in ActionKind])
_USAGE = {"prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "latency_s": pl.Float64, "cost_usd": pl.Float64}

NEGOTIATIONS_SCHEMA = pl.Schema(
    {
        "negotiation_id": pl.String,
        "attempt": pl.Int32,
        "run_id": pl.String,
        "arm": pl.String,
        "day": pl.Int32,
        "pair": pl.Int32,
        "step": pl.Int32,
        "group": pl.Int32,
        "policy_version": pl.Int32,
        "reward": pl.Float64,
        "scenario_id": pl.String,
        "scenario_hash": pl.String,
        "category": pl.String,
        "seller": pl.String,
        "buyer": pl.String,
        "seed": pl.Int64,
        "opener": ROLE,
        "max_rounds": pl.Int32,
        "end_reason": END_REASON,
        "agreed": pl.Boolean,
        "agreement": pl.String,
        "seller_utility": pl.Float64,
        "buyer_utility": pl.Float64,
        "seller_reservation": pl.Float64,
        "buyer_reservation": pl.Float64,
        "rounds": pl.Int32,
        "turns": pl.Int32,
        "turns_seller": pl.Int32,
        "turns_buyer": pl.Int32,
        "ended_by": ROLE,
        "invalid_seller": pl.Int32,
        "invalid_buyer": pl.Int32,
        "forfeits_seller": pl.Int32,
        "forfeits_buyer": pl.Int32,
        "error": pl.String,
        **{f"seller_{k}": t for k, t in _USAGE.items()},
        "seller_calls": pl.Int32,
        **{f"buyer_{k}": t for k, t in _USAGE.items()},
        "buyer_calls": pl.Int32,
        "wall_s": pl.Float64,
        "schema_version": pl.Int32,
    }
)
"""One row per negotiation attempt. ``agreement`` is the agreed offer as a JSON object (null without a deal).
``step``, ``group`` and ``policy_version`` place a negotiation in a learner's training, ``reward`` is what the
learner's reward function gave it (all null for negotiations no learner played)."""

TURNS_SCHEMA = pl.Schema(
    {
        "negotiation_id": pl.String,
        "attempt": pl.Int32,
        "index": pl.Int32,
        "round": pl.Int32,
        "role": ROLE,
        "try": pl.Int32,
        "kind": ACTION_KIND,
        "offer": pl.String,
        "message": pl.String,
        "raw": pl.String,
        "error": pl.String,
        "valid": pl.Boolean,
        "feedback": pl.String,
        "utility_seller": pl.Float64,
        "utility_buyer": pl.Float64,
        **_USAGE,
        "calls": pl.Int32,
    }
)
"""One row per attempted move. ``try`` counts attempts within a turn (0 first); usage columns are null when
the agent reported none. ``offer`` is a JSON object."""

TIMING_COLUMNS = ("wall_s", "seller_latency_s", "buyer_latency_s", "latency_s")
"""Columns that measure time and so differ between otherwise identical runs."""


def _offer_json(offer: Offer | None) -> str | None:
    return None if offer is None else offer.to_json()


NEGOTIATION_COLUMNS = tuple(NEGOTIATIONS_SCHEMA)
TURN_COLUMNS = tuple(TURNS_SCHEMA)


def negotiation_values(
    job: Job, attempt: int, result: NegotiationResult, wall_s: float, reward: float | None = None
) -> tuple[Any, ...]:
    """The negotiations-table row of one attempt, as a tuple in :data:`NEGOTIATIONS_SCHEMA`'s column order."""
    o, sc = result.outcome, job.scenario
    us, ub = result.usage_seller, result.usage_buyer
    sellers = sum(t.role is Role.SELLER for t in result.turns)
    return (
        job.negotiation_id,
        attempt,
        job.run_id,
        job.arm,
        job.day,
        job.pair,
        job.step,
        job.group,
        job.policy_version,
        reward,
        sc.id,
        scenario_hash(sc),
        sc.category,
        job.seller,
        job.buyer,
        job.seed,
        sc.opener.value,
        sc.max_rounds,
        o.end_reason.value,
        o.agreed,
        _offer_json(o.agreement),
        o.seller_utility,
        o.buyer_utility,
        sc.seller.reservation,
        sc.buyer.reservation,
        o.rounds,
        o.turns,
        sellers,
        len(result.turns) - sellers,
        None if o.ended_by is None else o.ended_by.value,
        o.invalid_seller,
        o.invalid_buyer,
        o.forfeits_seller,
        o.forfeits_buyer,
        o.error,
        us.prompt_tokens,
        us.completion_tokens,
        us.latency_s,
        us.cost_usd,
        us.calls,
        ub.prompt_tokens,
        ub.completion_tokens,
        ub.latency_s,
        ub.cost_usd,
        ub.calls,
        wall_s,
        SCHEMA_VERSION,
    )


def negotiation_row(
    job: Job, attempt: int, result: NegotiationResult, wall_s: float, reward: float | None = None
) -> dict[str, Any]:
    """The negotiations-table row of one attempt, by column name."""
    return dict(zip(NEGOTIATION_COLUMNS, negotiation_values(job, attempt, result, wall_s, reward), strict=True))


_NO_USAGE = (None, None, None, None, None)
_ROLE_VALUES = {r: r.value for r in Role}  # a dict lookup, not the enum's Python-level ``value`` property
_KIND_VALUES = {k: k.value for k in ActionKind}


def turn_values(negotiation_id: str, attempt: int, turns: Iterable[Turn]) -> list[tuple[Any, ...]]:
    """The turns-table rows of one attempt, as tuples in :data:`TURNS_SCHEMA`'s column order."""
    rows = []
    for t in turns:
        a = t.action
        u = a.usage
        usage = _NO_USAGE if u is None else (u.prompt_tokens, u.completion_tokens, u.latency_s, u.cost_usd, u.calls)
        rows.append(
            (
                negotiation_id,
                attempt,
                t.index,
                t.round,
                _ROLE_VALUES[t.role],
                t.attempt,
                _KIND_VALUES[a.kind],
                _offer_json(a.offer),
                a.message,
                a.raw,
                a.error,
                t.valid,
                t.feedback,
                t.utility_seller,
                t.utility_buyer,
                *usage,
            )
        )
    return rows


def turn_rows(negotiation_id: str, attempt: int, turns: Iterable[Turn]) -> list[dict[str, Any]]:
    """The turns-table rows of one attempt, by column name."""
    return [dict(zip(TURN_COLUMNS, row, strict=True)) for row in turn_values(negotiation_id, attempt, turns)]


def frame_of(rows: Sequence[tuple[Any, ...]], schema: pl.Schema) -> pl.DataFrame:
    """A table of ``rows`` (tuples in ``schema``'s column order), built column by column: several times faster than
    from one dict per row, with the same values and types (a number of another type is cast, as a build from rows
    casts it)."""
    columns = zip(*rows, strict=True) if rows else ((),) * len(schema)
    return pl.DataFrame(
        [
            pl.Series(name, values, dtype=dtype, strict=False)
            for (name, dtype), values in zip(schema.items(), columns, strict=True)
        ]
    )


def _usage(row: Mapping[str, Any], prefix: str = "") -> Usage | None:
    if row[f"{prefix}calls"] is None:
        return None
    return Usage(*(row[f"{prefix}{k}"] for k in (*_USAGE, "calls")))


def _offer(text: str | None) -> Offer | None:
    """The offer a transcript's JSON text holds; it keeps that text, so writing it again (or packing it for a worker)
    does not encode it anew."""
    return None if text is None else Offer.encoded(json.loads(text), text)


_TURN_READ = (
    "negotiation_id",
    "index",
    "round",
    "role",
    "try",
    "kind",
    "offer",
    "message",
    "raw",
    "error",
    "valid",
    "feedback",
    "utility_seller",
    "utility_buyer",
    *_USAGE,
    "calls",
)
"""The turns-table columns a result is rebuilt from, in the order :func:`results_from_tables` reads them."""


def _turns_by_id(turns: pl.DataFrame) -> dict[str, list[Turn]]:
    """Each negotiation's turns, in order, rebuilt from its rows (read as tuples: a dict per row costs more than the
    turn itself). An offer text that several turns repeat becomes one offer, as in the negotiation that was played."""
    by_id: dict[str, list[Turn]] = {}
    offers: dict[str, Offer] = {}
    rows = turns.sort("negotiation_id", "attempt", "index").select(_TURN_READ).iter_rows()
    for nid, index, round_, role, attempt, kind, text, message, raw, error, valid, feedback, us, ub, *usage in rows:
        offer = None
        if text is not None:
            offer = offers.get(text)
            if offer is None:
                offer = offers[text] = _offer(text)
        action = Action(KIND_OF[kind], offer, message, raw, error, None if usage[-1] is None else Usage(*usage))
        turn = Turn(index, round_, ROLE_OF[role], attempt, action, valid, feedback, us, ub)
        turns_of = by_id.get(nid)
        if turns_of is None:
            by_id[nid] = [turn]
        else:
            turns_of.append(turn)
    return by_id


def outcome_from_row(row: Mapping[str, Any]) -> Outcome:
    """The :class:`Outcome` recorded in one negotiations-table row."""
    return Outcome(
        EndReason(row["end_reason"]),
        _offer(row["agreement"]),
        row["seller_utility"],
        row["buyer_utility"],
        row["rounds"],
        row["turns"],
        None if row["ended_by"] is None else Role(row["ended_by"]),
        row["invalid_seller"],
        row["invalid_buyer"],
        row["forfeits_seller"],
        row["forfeits_buyer"],
        row["error"],
    )


def results_from_tables(negotiations: pl.DataFrame, turns: pl.DataFrame) -> dict[str, NegotiationResult]:
    """Rebuild :class:`NegotiationResult` objects from transcript rows, keyed by negotiation id (one attempt
    per id expected: pass latest attempts)."""
    by_id = _turns_by_id(turns)
    return {
        r["negotiation_id"]: NegotiationResult(
            r["scenario_id"],
            r["seed"],
            outcome_from_row(r),
            tuple(by_id.get(r["negotiation_id"], ())),
            _usage(r, "seller_") or Usage(),
            _usage(r, "buyer_") or Usage(),
        )
        for r in negotiations.iter_rows(named=True)
    }
