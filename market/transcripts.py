"""Transcripts as Parquet parts: one row per negotiation attempt and one per turn, crash-safe and resumable.

A directory holds ``negotiations/part-NNNNNNNN.parquet`` and ``turns/part-NNNNNNNN.parquet``. A part is
written to a temporary file and renamed into place, the turns part before its negotiations part, so a
negotiation counts as written exactly when its negotiations part exists. One process writes a directory at
a time; any number may read it.

A writer indexes the directory once when it opens it (the latest attempt of every negotiation and the part that
holds it) and keeps the index up to date as it writes, so a resumed run asks "is this done?" in O(1) per job and
reads back only the parts that hold the results it needs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Attempt:
    """The latest written (or buffered) attempt of one negotiation."""

    number: int
    ok: bool
    """True if the attempt ended without error."""
    part: int | None
    """The number of the part that holds it; None while it is still buffered."""


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
        self._index = self._read_index()

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

    def _read_index(self) -> dict[str, Attempt]:
        parts = _parts(self.directory, "negotiations")
        if not parts:
            return {}
        latest = (
            _scan(self.directory, "negotiations", NEGOTIATIONS_SCHEMA, parts, with_part=True)
            .group_by("negotiation_id")
            .agg(pl.col("attempt", "end_reason", "part").sort_by("attempt").last())
            .collect()
        )
        error = EndReason.ERROR.value
        return {nid: Attempt(n, reason != error, part) for nid, n, reason, part in latest.iter_rows()}

    def latest(self, negotiation_id: str) -> Attempt | None:
        """The latest attempt of ``negotiation_id`` on disk or buffered here (None if there is none)."""
        return self._index.get(negotiation_id)

    def attempts(self) -> dict[str, tuple[int, bool]]:
        """For every negotiation id on disk: its latest attempt number and whether that attempt completed
        without error."""
        return {nid: (a.number, a.ok) for nid, a in self._index.items()}

    def completed_ids(self) -> set[str]:
        """Ids whose latest written attempt ended without error (a resumed run skips these)."""
        return {nid for nid, a in self._index.items() if a.ok}

    def load_results(self, ids: Iterable[str]) -> dict[str, NegotiationResult]:
        """The latest attempt of each id in ``ids``, rebuilt as results; reads only the parts that hold them
        (buffered attempts are flushed first)."""
        wanted = list(ids)
        missing = [i for i in wanted if i not in self._index]
        if missing:
            raise KeyError(f"{len(missing)} negotiation(s) not found in {self.directory}, e.g. {missing[0]!r}")
        if any(self._index[i].part is None for i in wanted):
            self.flush()
        keys = pl.LazyFrame(
            {"negotiation_id": wanted, "attempt": [self._index[i].number for i in wanted]},
            schema={"negotiation_id": pl.String, "attempt": pl.Int32},
        )
        numbers = {self._index[i].part for i in wanted}
        negotiations, turns = pl.collect_all(
            [
                _scan(self.directory, table, schema, numbers).join(keys, on=["negotiation_id", "attempt"], how="semi")
                for table, schema in (("negotiations", NEGOTIATIONS_SCHEMA), ("turns", TURNS_SCHEMA))
            ]
        )
        return results_from_tables(negotiations, turns)

    def completed_rows(self, run_id: str) -> pl.DataFrame:
        """Negotiations rows of run ``run_id`` whose latest attempt ended without error, read in one pass over
        the parts on disk (what a resumed population needs to settle the days it does not play again)."""
        numbers = _parts(self.directory, "negotiations")
        return (
            _latest(_scan(self.directory, "negotiations", NEGOTIATIONS_SCHEMA, numbers))
            .filter((pl.col("run_id") == run_id) & (pl.col("end_reason") != EndReason.ERROR.value))
            .collect()
        )

    def add(
        self, job: Job, attempt: int, result: NegotiationResult, wall_s: float, reward: float | None = None
    ) -> None:
        """Buffer one attempt; writes a part once ``flush_every`` attempts are buffered."""
        self._negotiations.append(negotiation_row(job, attempt, result, wall_s, reward))
        self._turns.extend(turn_rows(job.negotiation_id, attempt, result.turns))
        self._index[job.negotiation_id] = Attempt(attempt, result.outcome.end_reason is not EndReason.ERROR, None)
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
            number = max(parts, default=-1) + 1
            name = f"part-{number:08d}.parquet"
            self._write(turns, "turns", name)
            self._write(negotiations, "negotiations", name)
        for row in self._negotiations:
            entry = self._index[row["negotiation_id"]]
            if entry.number == row["attempt"]:
                self._index[row["negotiation_id"]] = Attempt(entry.number, entry.ok, number)
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
        with locked(self.directory / ".lock"):
            parts = _parts(self.directory, "negotiations")
            if not parts:
                return 0
            cut = where.fill_null(False)
            by_part = (
                _scan(self.directory, "negotiations", NEGOTIATIONS_SCHEMA, parts, with_part=True)
                .group_by("part")
                .agg(cut.any().alias("any"), cut.all().alias("all"), pl.len().alias("rows"))
                .filter(pl.col("any"))
                .collect()
            )
            mixed = by_part.filter(~pl.col("all"))["part"].to_list()
            if mixed:
                raise ValueError(
                    f"{parts[mixed[0]]} holds negotiations on both sides of the cut ({why}): cannot roll back"
                )
            turns = _parts(self.directory, "turns")
            for n in by_part["part"].to_list():
                parts[n].unlink()  # negotiations first: a negotiation counts as written exactly while this part exists
                if n in turns:
                    turns[n].unlink()
        removed = int(by_part["rows"].sum())
        if removed:
            self._index = self._read_index()
            logger.warning("transcripts in %s: removed %d negotiation(s) %s", self.directory, removed, why)
        return removed

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _scan(
    directory: Path, table: str, schema: pl.Schema, numbers: Iterable[int], *, with_part: bool = False
) -> pl.LazyFrame:
    """The given parts of ``table`` (those that exist); ``with_part`` adds each row's part number as ``part``."""
    parts = _parts(directory, table)
    found = [n for n in sorted(numbers) if n in parts]
    if not found:
        empty = pl.LazyFrame(schema=schema)
        return empty.with_columns(pl.lit(None, pl.Int64).alias("part")) if with_part else empty
    try:
        if not with_part:
            return pl.scan_parquet([str(parts[n]) for n in found], schema=schema, missing_columns="insert")
        return pl.concat(
            [
                pl.scan_parquet(str(parts[n]), schema=schema, missing_columns="insert").with_columns(
                    pl.lit(n, pl.Int64).alias("part")
                )
                for n in found
            ]
        )
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
    by_id: dict[str, list[Turn]] = {}
    for row in turns.sort("negotiation_id", "attempt", "index").iter_rows(named=True):
        by_id.setdefault(row["negotiation_id"], []).append(_turn(row))
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


def load_results(directory: str | os.PathLike[str], ids: Iterable[str]) -> dict[str, NegotiationResult]:
    """The latest written attempt of each id in ``ids``, rebuilt as results."""
    wanted = pl.Series("negotiation_id", list(ids), dtype=pl.String)
    negotiations = read_negotiations(directory, latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    turns = read_turns(directory, latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    missing = set(wanted) - set(negotiations["negotiation_id"])
    if missing:
        raise KeyError(f"{len(missing)} negotiation(s) not found in {directory}, e.g. {sorted(missing)[0]!r}")
    return results_from_tables(negotiations, turns)
