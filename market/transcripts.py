"""Transcripts as Parquet parts: one row per negotiation attempt and one per turn, crash-safe and resumable.

A directory holds ``negotiations/part-NNNNNNNN.parquet`` and ``turns/part-NNNNNNNN.parquet``. A part is
written to a temporary file and renamed into place, the turns part before its negotiations part, so a
negotiation counts as written exactly when its negotiations part exists. One process writes a directory at
a time; any number may read it.

A writer indexes the directory once when it opens it (the latest attempt of every negotiation and the part that
holds it) and keeps the index up to date as it writes, so a resumed run asks "is this done?" in O(1) per job and
reads back only the parts that hold the results it needs. What a row holds is :mod:`.transcript_rows`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from .locks import locked
from .transcript_rows import (
    NEGOTIATIONS_SCHEMA,
    SCHEMA_VERSION,
    TURNS_SCHEMA,
    negotiation_row,
    results_from_tables,
    turn_rows,
)
from .types import EndReason, NegotiationResult

if TYPE_CHECKING:
    from .marketplace import Job

logger = logging.getLogger(__name__)


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


def load_results(directory: str | os.PathLike[str], ids: Iterable[str]) -> dict[str, NegotiationResult]:
    """The latest written attempt of each id in ``ids``, rebuilt as results."""
    wanted = pl.Series("negotiation_id", list(ids), dtype=pl.String)
    negotiations = read_negotiations(directory, latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    turns = read_turns(directory, latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    missing = set(wanted) - set(negotiations["negotiation_id"])
    if missing:
        raise KeyError(f"{len(missing)} negotiation(s) not found in {directory}, e.g. {sorted(missing)[0]!r}")
    return results_from_tables(negotiations, turns)
