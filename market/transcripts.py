"""Transcripts as Parquet parts: one row per negotiation attempt and one per turn, crash-safe and resumable.

A directory holds ``negotiations/part-NNNNNNNN.parquet`` and ``turns/part-NNNNNNNN.parquet``. A part is
written to a temporary file and renamed into place, the turns part before its negotiations part, so a
negotiation counts as written exactly when its negotiations part exists. One process writes a directory at
a time; any number may read it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from nego.scenarios.scenario import Role

from .locks import locked
from .marketplace import scenario_hash
from .types import Action, ActionKind, EndReason, NegotiationResult, Offer, Outcome, Turn, Usage

if TYPE_CHECKING:
    from .marketplace import Job

logger = logging.getLogger(__name__)

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
    return None if offer is None else json.dumps(offer.to_dict(), separators=(",", ":"))


def negotiation_row(
    job: Job, attempt: int, result: NegotiationResult, wall_s: float, reward: float | None = None
) -> dict[str, Any]:
    """The negotiations-table row of one attempt."""
    o, sc = result.outcome, job.scenario
    row: dict[str, Any] = {
        "negotiation_id": job.negotiation_id,
        "attempt": attempt,
        "run_id": job.run_id,
        "arm": job.arm,
        "day": job.day,
        "pair": job.pair,
        "step": job.step,
        "group": job.group,
        "policy_version": job.policy_version,
        "reward": reward,
        "scenario_id": sc.id,
        "scenario_hash": scenario_hash(sc),
        "category": sc.category,
        "seller": job.seller,
        "buyer": job.buyer,
        "seed": job.seed,
        "opener": sc.opener.value,
        "max_rounds": sc.max_rounds,
        "end_reason": o.end_reason.value,
        "agreed": o.agreed,
        "agreement": _offer_json(o.agreement),
        "seller_utility": o.seller_utility,
        "buyer_utility": o.buyer_utility,
        "seller_reservation": sc.seller.reservation,
        "buyer_reservation": sc.buyer.reservation,
        "rounds": o.rounds,
        "turns": o.turns,
        "turns_seller": sum(t.role is Role.SELLER for t in result.turns),
        "turns_buyer": sum(t.role is Role.BUYER for t in result.turns),
        "ended_by": None if o.ended_by is None else o.ended_by.value,
        "invalid_seller": o.invalid_seller,
        "invalid_buyer": o.invalid_buyer,
        "forfeits_seller": o.forfeits_seller,
        "forfeits_buyer": o.forfeits_buyer,
        "error": o.error,
        "wall_s": wall_s,
        "schema_version": SCHEMA_VERSION,
    }
    for side, usage in (("seller", result.usage_seller), ("buyer", result.usage_buyer)):
        for key in (*_USAGE, "calls"):
            row[f"{side}_{key}"] = getattr(usage, key)
    return row


def turn_rows(negotiation_id: str, attempt: int, turns: Iterable[Turn]) -> list[dict[str, Any]]:
    """The turns-table rows of one attempt."""
    rows = []
    for t in turns:
        a = t.action
        row = {
            "negotiation_id": negotiation_id,
            "attempt": attempt,
            "index": t.index,
            "round": t.round,
            "role": t.role.value,
            "try": t.attempt,
            "kind": a.kind.value,
            "offer": _offer_json(a.offer),
            "message": a.message,
            "raw": a.raw,
            "error": a.error,
            "valid": t.valid,
            "feedback": t.feedback,
            "utility_seller": t.utility_seller,
            "utility_buyer": t.utility_buyer,
        }
        for key in (*_USAGE, "calls"):
            row[key] = None if a.usage is None else getattr(a.usage, key)
        rows.append(row)
    return rows


def _parts(directory: Path, table: str) -> dict[int, Path]:
    folder = directory / table
    if not folder.is_dir():
        return {}
    return {int(p.name[5:13]): p for p in folder.glob("part-*.parquet") if p.name[5:13].isdigit()}


def _readable(path: Path) -> bool:
    try:
        pl.read_parquet_schema(path)
    except Exception:
        return False
    return True


class TranscriptWriter:
    """Buffers negotiation results and writes them as numbered Parquet parts.

    Opening a directory repairs what an interrupted writer left: temporary files, a turns part whose
    negotiations part was never renamed into place, and unreadable parts are removed (each count logged; the
    negotiations they held are simply not complete, so a resumed run plays them again).
    """

    def __init__(self, directory: str | os.PathLike[str], *, flush_every: int = 64, fsync: bool = False) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every}")
        self.directory = Path(directory)
        self.flush_every = flush_every
        self.fsync = fsync
        for table in ("negotiations", "turns"):
            (self.directory / table).mkdir(parents=True, exist_ok=True)
        with locked(self.directory / ".lock"):
            self.repairs = self._repair()
        """What opening removed: counts of 'tmp', 'orphan_turns' and 'unreadable' files."""
        self._negotiations: list[dict[str, Any]] = []
        self._turns: list[dict[str, Any]] = []
        self.written = 0
        """Negotiation rows written by this writer so far."""

    def _repair(self) -> dict[str, int]:
        counts = {"tmp": 0, "orphan_turns": 0, "unreadable": 0}
        for table in ("negotiations", "turns"):
            for tmp in (self.directory / table).glob(".*.tmp"):
                tmp.unlink()
                counts["tmp"] += 1
        negotiations, turns = _parts(self.directory, "negotiations"), _parts(self.directory, "turns")
        for n, path in negotiations.items():
            if not (_readable(path) and n in turns and _readable(turns[n])):
                path.unlink()
                counts["unreadable"] += 1
        negotiations = _parts(self.directory, "negotiations")
        for n, path in turns.items():
            if n not in negotiations:
                counts["orphan_turns" if _readable(path) else "unreadable"] += 1
                path.unlink()
        if any(counts.values()):
            logger.warning(
                "transcripts in %s: removed %d temporary file(s), %d turns part(s) without a negotiations part "
                "and %d unreadable part(s) left by an interrupted run; their negotiations will be played again",
                self.directory,
                counts["tmp"],
                counts["orphan_turns"],
                counts["unreadable"],
            )
        return counts

    def attempts(self) -> dict[str, tuple[int, bool]]:
        """For every negotiation id on disk: its latest attempt number and whether that attempt completed
        without error."""
        if not _parts(self.directory, "negotiations"):
            return {}
        latest = read_negotiations(self.directory, latest=True).select("negotiation_id", "attempt", "end_reason")
        return {nid: (attempt, reason != EndReason.ERROR.value) for nid, attempt, reason in latest.iter_rows()}

    def completed_ids(self) -> set[str]:
        """Ids whose latest written attempt ended without error (a resumed run skips these)."""
        return {nid for nid, (_, ok) in self.attempts().items() if ok}

    def add(
        self, job: Job, attempt: int, result: NegotiationResult, wall_s: float, reward: float | None = None
    ) -> None:
        """Buffer one attempt; writes a part once ``flush_every`` attempts are buffered."""
        self._negotiations.append(negotiation_row(job, attempt, result, wall_s, reward))
        self._turns.extend(turn_rows(job.negotiation_id, attempt, result.turns))
        if len(self._negotiations) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write buffered rows as the next part (turns part first, then the negotiations part)."""
        if not self._negotiations:
            return
        turns = pl.DataFrame(self._turns, schema=TURNS_SCHEMA, orient="row")
        negotiations = pl.DataFrame(self._negotiations, schema=NEGOTIATIONS_SCHEMA, orient="row")
        # the part number is taken under the directory's lock, so writers in other processes (or other writers on
        # the same directory) never pick the same one, and none repairs away a part another is writing
        with locked(self.directory / ".lock"):
            parts = set(_parts(self.directory, "negotiations")) | set(_parts(self.directory, "turns"))
            name = f"part-{max(parts, default=-1) + 1:08d}.parquet"
            self._write(turns, "turns", name)
            self._write(negotiations, "negotiations", name)
        self.written += len(self._negotiations)
        self._negotiations, self._turns = [], []

    def _write(self, frame: pl.DataFrame, table: str, name: str) -> None:
        folder = self.directory / table
        tmp = folder / f".{name}.tmp"
        frame.write_parquet(tmp)
        if self.fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, folder / name)
        if self.fsync:
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def rollback(self, where: pl.Expr, why: str) -> int:
        """Remove every part whose negotiations match ``where`` (for example ``pl.col("step") >= 7``); returns how many
        negotiation rows went. A resumed learner uses it to drop what a killed run played after its last checkpoint,
        which is then played again. A part must match as a whole: learners flush at the end of every step or day,
        so a part never mixes rows on both sides of such a cut (if one does, nothing is removed and ValueError says
        which part)."""
        self.flush()
        doomed: list[tuple[int, int]] = []
        with locked(self.directory / ".lock"):
            turns = _parts(self.directory, "turns")
            for n, path in sorted(_parts(self.directory, "negotiations").items()):
                hit = _scan(self.directory, "negotiations", NEGOTIATIONS_SCHEMA, [n]).select(where.fill_null(False))
                flags = hit.collect().to_series()
                if flags.any() and not flags.all():
                    raise ValueError(f"{path} holds negotiations on both sides of the cut ({why}): cannot roll back")
                if flags.any():
                    doomed.append((n, len(flags)))
            for n, _ in doomed:
                (self.directory / "negotiations" / f"part-{n:08d}.parquet").unlink()  # first: it makes rows count
                if n in turns:
                    turns[n].unlink()
        removed = sum(rows for _, rows in doomed)
        if removed:
            logger.warning("transcripts in %s: removed %d negotiation(s) %s", self.directory, removed, why)
        return removed

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _scan(directory: Path, table: str, schema: pl.Schema, numbers: Iterable[int]) -> pl.LazyFrame:
    parts = _parts(directory, table)
    paths = [str(parts[n]) for n in sorted(numbers) if n in parts]
    if not paths:
        return pl.LazyFrame(schema=schema)
    try:
        return pl.scan_parquet(paths, schema=schema, missing_columns="insert")
    except Exception as e:
        raise ValueError(
            f"cannot read {table} transcripts in {directory} with schema version {SCHEMA_VERSION}: {e}"
        ) from e


def _latest(frame: pl.LazyFrame) -> pl.LazyFrame:
    last = frame.group_by("negotiation_id").agg(pl.col("attempt").max())
    return frame.join(last, on=["negotiation_id", "attempt"], how="semi")


def read_negotiations(directory: str | os.PathLike[str], *, latest: bool = False) -> pl.DataFrame:
    """All negotiation attempts in ``directory`` sorted by (negotiation_id, attempt); with ``latest`` only the
    latest attempt of each negotiation (an error attempt stays only while no later attempt exists)."""
    d = Path(directory)
    frame = _scan(d, "negotiations", NEGOTIATIONS_SCHEMA, _parts(d, "negotiations"))
    if latest:
        frame = _latest(frame)
    return frame.sort("negotiation_id", "attempt").collect()


def read_turns(directory: str | os.PathLike[str], *, latest: bool = False) -> pl.DataFrame:
    """Turns of the written negotiation attempts, sorted by (negotiation_id, attempt, index). A turns part
    whose negotiations part is not in place yet is ignored; ``latest`` keeps the latest attempts only."""
    d = Path(directory)
    numbers = _parts(d, "negotiations")
    frame = _scan(d, "turns", TURNS_SCHEMA, numbers)
    if latest:
        # the latest attempt may have no turns at all (an agent that could not be built), so take the
        # attempt numbers from the negotiations table
        keys = _latest(_scan(d, "negotiations", NEGOTIATIONS_SCHEMA, numbers)).select("negotiation_id", "attempt")
        frame = frame.join(keys, on=["negotiation_id", "attempt"], how="semi")
    return frame.sort("negotiation_id", "attempt", "index").collect()


def _usage(row: Mapping[str, Any], prefix: str = "") -> Usage | None:
    if row[f"{prefix}calls"] is None:
        return None
    return Usage(*(row[f"{prefix}{k}"] for k in (*_USAGE, "calls")))


def _offer(text: str | None) -> Offer | None:
    return None if text is None else Offer(json.loads(text))


def _turn(row: Mapping[str, Any]) -> Turn:
    action = Action(
        ActionKind(row["kind"]), _offer(row["offer"]), row["message"], row["raw"], row["error"], _usage(row)
    )
    return Turn(
        row["index"],
        row["round"],
        Role(row["role"]),
        row["try"],
        action,
        row["valid"],
        row["feedback"],
        row["utility_seller"],
        row["utility_buyer"],
    )


def results_from_tables(negotiations: pl.DataFrame, turns: pl.DataFrame) -> dict[str, NegotiationResult]:
    """Rebuild :class:`NegotiationResult` objects from transcript rows, keyed by negotiation id (one attempt
    per id expected: pass latest attempts)."""
    by_id: dict[str, list[Turn]] = {}
    for row in turns.sort("negotiation_id", "attempt", "index").iter_rows(named=True):
        by_id.setdefault(row["negotiation_id"], []).append(_turn(row))
    results = {}
    for r in negotiations.iter_rows(named=True):
        outcome = Outcome(
            EndReason(r["end_reason"]),
            _offer(r["agreement"]),
            r["seller_utility"],
            r["buyer_utility"],
            r["rounds"],
            r["turns"],
            None if r["ended_by"] is None else Role(r["ended_by"]),
            r["invalid_seller"],
            r["invalid_buyer"],
            r["forfeits_seller"],
            r["forfeits_buyer"],
            r["error"],
        )
        results[r["negotiation_id"]] = NegotiationResult(
            r["scenario_id"],
            r["seed"],
            outcome,
            tuple(by_id.get(r["negotiation_id"], ())),
            _usage(r, "seller_") or Usage(),
            _usage(r, "buyer_") or Usage(),
        )
    return results


def load_results(directory: str | os.PathLike[str], ids: Iterable[str]) -> dict[str, NegotiationResult]:
    """The latest written attempt of each id in ``ids``, rebuilt as results."""
    wanted = pl.Series("negotiation_id", list(ids), dtype=pl.String)
    negotiations = read_negotiations(directory, latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    turns = read_turns(directory, latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    missing = set(wanted) - set(negotiations["negotiation_id"])
    if missing:
        raise KeyError(f"{len(missing)} negotiation(s) not found in {directory}, e.g. {sorted(missing)[0]!r}")
    return results_from_tables(negotiations, turns)
