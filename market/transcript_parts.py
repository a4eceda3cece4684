"""The files of a transcript directory: which part files it holds, which of them a reader reads, the repair of what an
interrupted writer left, and which parts compaction merges next.

A part file is named by the span of part numbers it covers: ``part-00000007.parquet`` is the part written as number
7, ``part-00000000-00000015.parquet`` the part that compaction made of every part numbered 0 to 15. A compacted part
is renamed into place (turns first, then negotiations) before the parts it replaces are deleted, so a part whose span
lies inside the span of another negotiations part is a leftover: readers skip it, and the next writer to open the
directory deletes it. Spans of the parts a reader reads never overlap.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

TABLES = ("negotiations", "turns")
PART_NUMBER = r"part-(\d+)(?:-\d+)?\.parquet$"
"""A regular expression whose first group is the first part number in a part file's path."""

_NAME = re.compile(r"part-(\d+)(?:-(\d+))?\.parquet")


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """The part numbers one part file covers: its own number for a part as written, the numbers of the parts it
    replaced for a compacted one."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, name: str) -> Span | None:
        """The span a part file's name says, or None if the name is not one of a part."""
        match = _NAME.fullmatch(name)
        if match is None:
            return None
        lo = int(match[1])
        if match[2] is None:
            return cls(lo, lo)
        hi = int(match[2])
        return cls(lo, hi) if lo < hi else None

    @property
    def name(self) -> str:
        if self.lo == self.hi:
            return f"part-{self.lo:08d}.parquet"
        return f"part-{self.lo:08d}-{self.hi:08d}.parquet"

    @property
    def size(self) -> int:
        """How many part numbers it covers."""
        return self.hi - self.lo + 1


def part_files(directory: Path, table: str) -> dict[Span, str]:
    """The part files of ``table`` in ``directory`` by span, in span order (temporary files are not parts)."""
    # plain strings and one listing: a folder with compaction off can hold many thousands of parts
    folder = os.path.join(directory, table)
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = [(span, name) for name in names if (span := Span.parse(name)) is not None]
    found.sort(key=lambda item: (item[0].lo, item[0].hi))
    return {span: os.path.join(folder, name) for span, name in found}


def last_number(directory: Path) -> int:
    """The highest part number that a part file of either table covers (-1 if there is none)."""
    return max((s.hi for table in TABLES for s in part_files(directory, table)), default=-1)


def covered(spans: Iterable[Span], by: Iterable[Span]) -> set[Span]:
    """The spans among ``spans`` that lie inside another span of ``by``."""
    coverers = set(by)
    reach, inside = -1, set()
    # in (lo, longest first) order every span of ``by`` that could hold a span comes before it
    for span in sorted(set(spans) | coverers, key=lambda s: (s.lo, -s.hi)):
        if span.hi <= reach:
            inside.add(span)
        if span in coverers:
            reach = max(reach, span.hi)
    return inside


@dataclass(frozen=True, slots=True)
class Visible:
    """The parts a reader reads: every negotiations part that no other negotiations part covers, in span order, and
    the turns parts of those that have one."""

    negotiations: dict[Span, str]
    turns: dict[Span, str]

    def containing(self, numbers: Iterable[int]) -> list[Span]:
        """The parts whose spans hold the given part numbers (numbers no part holds are left out)."""
        spans = list(self.negotiations)
        starts = [s.lo for s in spans]
        found = set()
        for n in numbers:
            i = bisect.bisect_right(starts, n) - 1
            if i >= 0 and spans[i].hi >= n:
                found.add(spans[i])
        return sorted(found)

    def holds(self, earlier: Visible) -> bool:
        """True if every part of ``earlier`` is still here, as the same files (parts added since do not matter)."""
        return all(self.negotiations.get(s) == p for s, p in earlier.negotiations.items()) and all(
            self.turns.get(s) == p for s, p in earlier.turns.items()
        )


def visible(directory: Path) -> Visible:
    """What a reader of ``directory`` reads now."""
    # negotiations are listed first: a part renamed into place before that listing had its turns part renamed
    # earlier still, so the turns listing finds it (unless it was deleted since, which Visible.holds tells)
    negotiations = part_files(directory, "negotiations")
    turns = part_files(directory, "turns")
    inside = covered(negotiations, negotiations)
    shown = {s: p for s, p in negotiations.items() if s not in inside}
    return Visible(shown, {s: turns[s] for s in shown if s in turns})


def _readable(path: str) -> bool:
    try:
        pl.read_parquet_schema(path)
    except Exception:
        return False
    return True


def repair(directory: Path) -> tuple[dict[str, int], int]:
    """Remove what an interrupted writer left in ``directory`` (the caller holds its lock). Returns the counts of
    removed temporary files, turns parts without a negotiations part and unreadable parts, and apart from those the
    number of parts an interrupted compaction left (parts it had replaced, or its turns part if its negotiations part
    never came): their rows are all in other parts."""
    counts = {"tmp": 0, "orphan_turns": 0, "unreadable": 0}
    for table in TABLES:
        for tmp in (directory / table).glob(".*.tmp"):
            tmp.unlink()
            counts["tmp"] += 1
    negotiations, turns = part_files(directory, "negotiations"), part_files(directory, "turns")
    readable = {p for p in (*negotiations.values(), *turns.values()) if _readable(p)}
    complete = {s for s, p in negotiations.items() if p in readable and s in turns and turns[s] in readable}
    replaced = covered([*negotiations, *turns], complete)
    for span in sorted(replaced):
        for files in (negotiations, turns):  # negotiations first, as everywhere
            if span in files:
                os.unlink(files.pop(span))
    leftovers = len(replaced)
    damaged = [s for s in negotiations if s not in complete]
    for span in damaged:
        os.unlink(negotiations.pop(span))
        counts["unreadable"] += 1
    for span, path in turns.items():
        if span in negotiations:
            continue
        if span.size > 1 and span not in damaged:
            leftovers += 1  # a compaction killed between its two renames: its sources are all still here
        else:
            counts["orphan_turns" if path in readable else "unreadable"] += 1
        os.unlink(path)
    return counts, leftovers


def tier(span: Span, fanout: int) -> int:
    """The size tier of a part: 0 for spans of 1 to ``fanout`` - 1 numbers, 1 up to ``fanout``**2 - 1, and so on."""
    size, level = span.size, 0
    while size >= fanout:
        size //= fanout
        level += 1
    return level


def next_merge(spans: Sequence[Span], fanout: int) -> list[Span] | None:
    """The parts to merge next, or None: the first run of at least ``fanout`` consecutive parts of one tier, cut to
    the largest power of ``fanout`` it holds. A directory written part by part then keeps fewer than ``fanout`` parts
    per tier, so at most (``fanout`` - 1) x (1 + log_fanout of the parts written) parts, and each row is rewritten
    once per tier; a folder of many small parts (compaction off, or an older writer) is merged in one pass per
    power of ``fanout``."""
    start = 0
    while start < len(spans):
        level = tier(spans[start], fanout)
        end = start
        while end < len(spans) and tier(spans[end], fanout) == level:
            end += 1
        if end - start >= fanout:
            size = fanout
            while size * fanout <= end - start:
                size *= fanout
            return list(spans[start : start + size])
        start = end
    return None
