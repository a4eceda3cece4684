"""Transcripts as Parquet parts: one row per negotiation attempt and one per turn, crash-safe, resumable and compacted.

A directory holds ``negotiations/part-*.parquet`` and ``turns/part-*.parquet``. A part is written to a temporary
file and renamed into place, the turns part before its negotiations part, so a negotiation counts as written exactly
when its negotiations part exists. One process writes a directory at a time; any number may read it.

A writer indexes the directory once when it opens it (the latest attempt of every negotiation and the part that
holds it), in one scan over the parts, and keeps the index up to date as it writes, so a resumed run asks "is this
done?" in O(1) per job and reads back only the parts that hold the results it needs. Opening and reading take time
linear in the parts. The writer keeps their count bounded by merging runs of parts of one size into one part that
covers their numbers (:mod:`.transcript_parts` names the files and chooses the merges; a kill at any point of a
merge leaves every row in place exactly once after the next open). :meth:`TranscriptWriter.copy_from` brings in the
attempts another directory holds, as one part (a sharded evaluation merges its shards that way). What a row holds is
:mod:`.transcript_rows`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from .locks import locked
from .transcript_parts import PART_NUMBER, Span, Visible, last_number, next_merge, repair, visible
from .transcript_rows import (
    NEGOTIATIONS_SCHEMA,
    SCHEMA_VERSION,
    TURNS_SCHEMA,
    frame_of,
    negotiation_values,
    results_from_tables,
    turn_values,
)
from .types import EndReason, NegotiationResult

if TYPE_CHECKING:
    from .marketplace import Job

logger = logging.getLogger(__name__)

COMPACT_AT = 16
"""The default fan-out of compaction: this many consecutive parts of one size tier are merged into one."""

_READ_TRIES = 5


@dataclass(frozen=True, slots=True)
class Attempt:
    """The latest written (or buffered) attempt of one negotiation."""

    number: int
    ok: bool
    """True if the attempt ended without error."""
    part: int | None
    """The number of the part that holds it (a compacted part holds the numbers of the parts it replaced, and is
    read as its first one); None while it is still buffered."""


class TranscriptWriter:
    """Buffers negotiation results and writes them as numbered Parquet parts.

    Opening a directory repairs what an interrupted writer left: temporary files, a turns part whose
    negotiations part was never renamed into place, and unreadable parts are removed (each count logged; the
    negotiations they held are simply not complete, so a resumed run plays them again), and so are the parts an
    interrupted compaction left (their rows are in other parts). ``compact_at`` consecutive parts of one size tier
    are merged into one, on opening and after every flush (None: parts stay as written).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        flush_every: int = 64,
        fsync: bool = False,
        compact_at: int | None = COMPACT_AT,
    ) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every}")
        if compact_at is not None and compact_at < 2:
            raise ValueError(f"compact_at must be >= 2 or None, got {compact_at}")
        self.directory = Path(directory)
        self.flush_every = flush_every
        self.fsync = fsync
        self.compact_at = compact_at
        for table in ("negotiations", "turns"):
            (self.directory / table).mkdir(parents=True, exist_ok=True)
        # rows as tuples in their schema's column order (see transcript_rows.frame_of)
        self._negotiations: list[tuple[Any, ...]] = []
        self._turns: list[tuple[Any, ...]] = []
        self.written = 0
        """Negotiation rows written by this writer so far."""
        with self._lock():
            counts, leftovers = self._repair()
            self.repairs = counts
            """What opening removed: counts of 'tmp', 'orphan_turns' and 'unreadable' files."""
            self.leftovers = leftovers
            """How many parts an interrupted compaction left, which opening removed (their rows are in other parts)."""
            self._compact()
            self._index = self._read_index()

    def _lock(self) -> AbstractContextManager[None]:
        return locked(self.directory / ".lock")

    def _repair(self) -> tuple[dict[str, int], int]:
        counts, leftovers = repair(self.directory)
        if any(counts.values()):
            logger.warning(
                "transcripts in %s: removed %d temporary file(s), %d turns part(s) without a negotiations part "
                "and %d unreadable part(s) left by an interrupted run; their negotiations will be played again",
                self.directory,
                counts["tmp"],
                counts["orphan_turns"],
                counts["unreadable"],
            )
        if leftovers:
            logger.info(
                "transcripts in %s: removed %d part(s) left by an interrupted compaction (their rows are in other "
                "parts)",
                self.directory,
                leftovers,
            )
        return counts, leftovers

    def _read_index(self) -> dict[str, Attempt]:
        parts = visible(self.directory)
        if not parts.negotiations:
            return {}
        latest = (
            _scan(parts.negotiations.values(), NEGOTIATIONS_SCHEMA, with_path=True)
            .group_by("negotiation_id")
            .agg(pl.col("attempt", "end_reason", "path").sort_by("attempt").last())
            .with_columns(pl.col("path").str.extract(PART_NUMBER, 1).cast(pl.Int64))
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
        with self._lock():  # no other writer's compaction deletes a part while it is read
            parts = visible(self.directory)
            spans = parts.containing(p for i in wanted if (p := self._index[i].part) is not None)
            negotiations, turns = pl.collect_all(
                [
                    _scan(paths, schema).join(keys, on=["negotiation_id", "attempt"], how="semi")
                    for paths, schema in (
                        ([parts.negotiations[s] for s in spans], NEGOTIATIONS_SCHEMA),
                        ([parts.turns[s] for s in spans if s in parts.turns], TURNS_SCHEMA),
                    )
                ]
            )
        return results_from_tables(negotiations, turns)

    def completed_rows(self, run_id: str) -> pl.DataFrame:
        """Negotiations rows of run ``run_id`` whose latest attempt ended without error, read in one pass over
        the parts on disk (what a resumed population needs to settle the days it does not play again)."""
        with self._lock():
            paths = visible(self.directory).negotiations.values()
            return (
                _latest(_scan(paths, NEGOTIATIONS_SCHEMA))
                .filter((pl.col("run_id") == run_id) & (pl.col("end_reason") != EndReason.ERROR.value))
                .collect()
            )

    def add(
        self, job: Job, attempt: int, result: NegotiationResult, wall_s: float, reward: float | None = None
    ) -> None:
        """Buffer one attempt; writes a part once ``flush_every`` attempts are buffered."""
        self._negotiations.append(negotiation_values(job, attempt, result, wall_s, reward))
        self._turns.extend(turn_values(job.negotiation_id, attempt, result.turns))
        self._index[job.negotiation_id] = Attempt(attempt, result.outcome.end_reason is not EndReason.ERROR, None)
        if len(self._negotiations) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write buffered rows as the next part (turns part first, then the negotiations part), then compact."""
        if not self._negotiations:
            return
        turns = frame_of(self._turns, TURNS_SCHEMA)
        negotiations = frame_of(self._negotiations, NEGOTIATIONS_SCHEMA)
        # the part number is taken under the directory's lock, so writers in other processes (or other writers on
        # the same directory) never pick the same one, and none repairs away a part another is writing
        with self._lock():
            number = last_number(self.directory) + 1
            name = Span(number, number).name
            self._write(turns, "turns", name)
            self._write(negotiations, "negotiations", name)
            for negotiation_id, attempt, *_ in self._negotiations:
                entry = self._index[negotiation_id]
                if entry.number == attempt:
                    self._index[negotiation_id] = Attempt(entry.number, entry.ok, number)
            self.written += len(self._negotiations)
            self._negotiations, self._turns = [], []
            self._compact()  # the rows are written and accounted for: a failing merge cannot write them twice

    def _write(self, frame: pl.DataFrame | pl.LazyFrame, table: str, name: str) -> None:
        folder = self.directory / table
        tmp = folder / f".{name}.tmp"
        # through a file object: polars given a path opens it twice with O_TRUNC, after which unlinking the file
        # takes milliseconds on ext4 (compaction unlinks every part it merges); a lazy frame is streamed, so a merge
        # of large parts never holds them in memory
        with open(tmp, "wb") as f:
            if isinstance(frame, pl.LazyFrame):
                frame.sink_parquet(f)
            else:
                frame.write_parquet(f)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, folder / name)
        if self.fsync:
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _compact(self) -> None:
        """Merge parts while ``next_merge`` finds some to merge (the caller holds the lock)."""
        if self.compact_at is None:
            return
        while (run := next_merge(list(visible(self.directory).negotiations), self.compact_at)) is not None:
            self._merge(run, Span(run[0].lo, run[-1].hi))

    def _merge(self, sources: list[Span], target: Span, keep: pl.Expr | None = None) -> None:
        """Replace the parts ``sources`` (consecutive visible parts, inside ``target``) by one part ``target`` holding
        their rows in order, or only the negotiations matching ``keep`` and their turns (the caller holds the lock).

        Until its negotiations part is renamed into place the sources are what every reader reads, and after that
        the new part: a kill in between leaves either its turns part alone or sources it covers, both removed on
        the next open."""
        parts = visible(self.directory)
        negotiations = _scan([parts.negotiations[s] for s in sources], NEGOTIATIONS_SCHEMA)
        turns = _scan([parts.turns[s] for s in sources if s in parts.turns], TURNS_SCHEMA)
        if keep is not None:
            negotiations = negotiations.filter(keep)
            kept = negotiations.select("negotiation_id", "attempt")
            turns = turns.join(kept, on=["negotiation_id", "attempt"], how="semi", maintain_order="left")
        self._write(turns, "turns", target.name)
        self._write(negotiations, "negotiations", target.name)
        for span in sources:
            os.unlink(parts.negotiations[span])  # negotiations first: a turns part alone is never read
            if span in parts.turns:
                os.unlink(parts.turns[span])

    def rollback(self, where: pl.Expr, why: str) -> int:
        """Remove every negotiation that matches ``where`` (for example ``pl.col("step") >= 7``) with its turns;
        returns how many negotiation rows went. A resumed learner uses it to drop what a killed run played after its
        last checkpoint, which is then played again. A part as written must match as a whole: learners flush at the
        end of every step or day, so a part never mixes rows on both sides of such a cut (if one does, nothing is
        removed and ValueError says which part). A compacted part that mixes them is merged, with the parts after
        it, into one new part without the matching rows."""
        self.flush()
        with self._lock():
            parts = visible(self.directory)
            if not parts.negotiations:
                return 0
            cut = where.fill_null(False)
            by_path = (
                _scan(parts.negotiations.values(), NEGOTIATIONS_SCHEMA, with_path=True)
                .group_by("path")
                .agg(cut.sum().alias("cut"), pl.len().alias("rows"))
                .filter(pl.col("cut") > 0)
                .collect()
            )
            span_of = {p: s for s, p in parts.negotiations.items()}
            hit = {span_of[path]: (cut_rows, rows) for path, cut_rows, rows in by_path.iter_rows()}
            mixed = sorted(s for s, (cut_rows, rows) in hit.items() if cut_rows < rows)
            as_written = [s for s in mixed if s.size == 1]
            if as_written:
                raise ValueError(
                    f"{parts.negotiations[as_written[0]]} holds negotiations on both sides of the cut ({why}): "
                    "cannot roll back"
                )
            start = mixed[0].lo if mixed else None
            for span in sorted(hit):
                if start is None or span.lo < start:
                    os.unlink(parts.negotiations[span])  # negotiations first: a negotiation counts as
                    if span in parts.turns:  # written exactly while this part exists
                        os.unlink(parts.turns[span])
            if start is not None:
                tail = [s for s in parts.negotiations if s.lo >= start]
                self._merge(tail, Span(start, last_number(self.directory) + 1), keep=~cut)
            removed = sum(cut_rows for cut_rows, _ in hit.values())
            if removed:
                self._index = self._read_index()
        if removed:
            logger.warning("transcripts in %s: removed %d negotiation(s) %s", self.directory, removed, why)
        return removed

    def copy_from(self, source: str | os.PathLike[str], ids: Iterable[str] | None = None) -> int:
        """Copy in the attempts that the transcripts in ``source`` hold and this directory lacks (a negotiations row
        with its turns; attempts are told apart by negotiation id and attempt number), only those of ``ids`` if given;
        returns how many negotiations rows came in. They are written as one part, in (negotiation id, attempt) order,
        so a copy interrupted at any point leaves all of them or none after the next open, and copying again adds
        nothing. ``source`` is read as any reader reads it; nothing there changes."""
        self.flush()
        keys = ["negotiation_id", "attempt"]
        wanted = None if ids is None else pl.Series(list(ids), dtype=pl.String)

        def source_negotiations(parts: Visible) -> pl.LazyFrame:
            frame = _scan(parts.negotiations.values(), NEGOTIATIONS_SCHEMA)
            return (frame if wanted is None else frame.filter(pl.col("negotiation_id").is_in(wanted))).sort(keys)

        incoming = _read(source, source_negotiations)
        with self._lock():
            present = _scan(visible(self.directory).negotiations.values(), NEGOTIATIONS_SCHEMA).select(keys)
            fresh = incoming.join(present.collect(), on=keys, how="anti", maintain_order="left")
            if fresh.is_empty():
                return 0

            def source_turns(parts: Visible) -> pl.LazyFrame:
                frame = _scan(parts.turns.values(), TURNS_SCHEMA)
                return frame.join(fresh.lazy().select(keys), on=keys, how="semi").sort([*keys, "index"])

            turns = _read(source, source_turns)
            number = last_number(self.directory) + 1
            name = Span(number, number).name
            self._write(turns, "turns", name)
            self._write(fresh, "negotiations", name)
            self.written += fresh.height
            self._compact()
            self._index = self._read_index()
        return fresh.height

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _scan(paths: Iterable[str], schema: pl.Schema, *, with_path: bool = False) -> pl.LazyFrame:
    """The rows of the given part files of one table, in file order, as one scan; ``with_path`` adds each row's
    file as ``path``."""
    files = list(paths)
    if not files:
        empty = pl.LazyFrame(schema=schema)
        return empty.with_columns(pl.lit(None, pl.String).alias("path")) if with_path else empty
    try:
        return pl.scan_parquet(
            files,
            schema=schema,
            missing_columns="insert",
            glob=False,
            include_file_paths="path" if with_path else None,
        )
    except Exception as e:
        folder = Path(files[0]).parent
        raise ValueError(
            f"cannot read {folder.name} transcripts in {folder.parent} with schema version {SCHEMA_VERSION}: {e}"
        ) from e


def _latest(frame: pl.LazyFrame) -> pl.LazyFrame:
    last = frame.group_by("negotiation_id").agg(pl.col("attempt").max())
    return frame.join(last, on=["negotiation_id", "attempt"], how="semi")


def _read(directory: str | os.PathLike[str], build: Callable[[Visible], pl.LazyFrame]) -> pl.DataFrame:
    """``build`` over the parts a reader sees, collected; read again if a writer replaced or removed any of them
    meanwhile (a compaction or a rollback), so the rows are those of one state of the directory."""
    d = Path(directory)
    for _ in range(_READ_TRIES):
        parts = visible(d)
        try:
            frame = build(parts).collect()
        except Exception:
            if visible(d).holds(parts):
                raise
            continue
        if visible(d).holds(parts):
            return frame
    raise RuntimeError(f"the transcript parts in {d} changed during each of {_READ_TRIES} reads")


def read_negotiations(directory: str | os.PathLike[str], *, latest: bool = False) -> pl.DataFrame:
    """All negotiation attempts in ``directory`` sorted by (negotiation_id, attempt); with ``latest`` only the
    latest attempt of each negotiation (an error attempt stays only while no later attempt exists)."""

    def build(parts: Visible) -> pl.LazyFrame:
        frame = _scan(parts.negotiations.values(), NEGOTIATIONS_SCHEMA)
        return (_latest(frame) if latest else frame).sort("negotiation_id", "attempt")

    return _read(directory, build)


def read_turns(directory: str | os.PathLike[str], *, latest: bool = False) -> pl.DataFrame:
    """Turns of the written negotiation attempts, sorted by (negotiation_id, attempt, index). A turns part
    whose negotiations part is not in place yet is ignored; ``latest`` keeps the latest attempts only."""

    def build(parts: Visible) -> pl.LazyFrame:
        frame = _scan(parts.turns.values(), TURNS_SCHEMA)
        if latest:
            # the latest attempt may have no turns at all (an agent that could not be built), so take the
            # attempt numbers from the negotiations table
            keys = _latest(_scan(parts.negotiations.values(), NEGOTIATIONS_SCHEMA)).select("negotiation_id", "attempt")
            frame = frame.join(keys, on=["negotiation_id", "attempt"], how="semi")
        return frame.sort("negotiation_id", "attempt", "index")

    return _read(directory, build)


def load_results(directory: str | os.PathLike[str], ids: Iterable[str]) -> dict[str, NegotiationResult]:
    """The latest written attempt of each id in ``ids``, rebuilt as results."""
    wanted = pl.Series("negotiation_id", list(ids), dtype=pl.String)
    negotiations = read_negotiations(directory, latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    turns = read_turns(directory, latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    missing = set(wanted) - set(negotiations["negotiation_id"])
    if missing:
        raise KeyError(f"{len(missing)} negotiation(s) not found in {directory}, e.g. {sorted(missing)[0]!r}")
    return results_from_tables(negotiations, turns)
