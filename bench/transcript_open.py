"""How opening a transcript folder grows with its parts, and how many parts compaction leaves after a long run.

Plays ``max(--sizes)`` rule-based negotiations (generated scenarios, Boulware seller, Conceder buyer) and writes
each as its own part (a one-row negotiations part and its turns part, in the writer's schema and file names), then
times, for folders of the first N parts (hard links of the same files), what a resumed run does first: open a
``TranscriptWriter`` (repair and index; compaction off, so that N parts are indexed) and read every row back
(``read_negotiations``, ``read_turns``). Linear work keeps the seconds per part flat: the last line gives the
per-part time of the largest folder over that of the smallest. For contrast on folders up to ``--contrast-max``
parts: the index built as before, one scan per part file, each with a literal part column.

Then the real writer flushing after every negotiation (``flush_every=1``) for ``--flushes`` negotiations, with
compaction on (the default fan-out) and off: the most parts it ever held (with compaction, against the bound
(fan-out - 1) x (1 + log_fan-out of the flushes)), the parts at the end, and the time per flush of each; and the
largest folder opened once with compaction on (merged in place), with its parts after and the time that took.

    python bench/transcript_open.py
    python bench/transcript_open.py --sizes 100,500,1000 --flushes 500
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import polars as pl
from nego.agents.registry import resolve
from nego.market.marketplace import Job, run_jobs
from nego.market.transcript_parts import Span, part_files
from nego.market.transcript_rows import NEGOTIATIONS_SCHEMA, TURNS_SCHEMA, negotiation_row, turn_rows
from nego.market.transcripts import COMPACT_AT, TranscriptWriter, read_negotiations, read_turns
from nego.market.types import NegotiationResult
from nego.scenarios.generator import generate_scenario

SELLER, BUYER = "boulware", "conceder"


def play(n: int) -> list[tuple[Job, NegotiationResult]]:
    scenarios = [generate_scenario(0, index=i) for i in range(50)]
    jobs = [Job(scenarios[i % len(scenarios)], SELLER, BUYER, seed=i, run_id="bench") for i in range(n)]
    results = run_jobs({SELLER: resolve(SELLER), BUYER: resolve(BUYER)}, jobs)
    return list(zip(jobs, results, strict=True))


def write_parts(directory: Path, played: list[tuple[Job, NegotiationResult]]) -> None:
    """One part per negotiation, written directly (a writer with compaction off writes the same files)."""
    negotiations = pl.DataFrame(
        [negotiation_row(job, 0, result, 0.0) for job, result in played], schema=NEGOTIATIONS_SCHEMA, orient="row"
    )
    rows = [row for job, result in played for row in turn_rows(job.negotiation_id, 0, result.turns)]
    turns = pl.DataFrame(rows, schema=TURNS_SCHEMA, orient="row")
    by_id = turns.partition_by("negotiation_id", as_dict=True, maintain_order=True)
    for table in ("negotiations", "turns"):
        (directory / table).mkdir(parents=True)
    for number, (job, _) in enumerate(played):
        name = Span(number, number).name
        by_id.get((job.negotiation_id,), turns.clear()).write_parquet(directory / "turns" / name)
        negotiations.slice(number, 1).write_parquet(directory / "negotiations" / name)


def linked(source: Path, target: Path, n: int) -> Path:
    """A folder holding hard links to the first ``n`` parts of ``source``."""
    for table in ("negotiations", "turns"):
        (target / table).mkdir(parents=True)
        for number in range(n):
            name = Span(number, number).name
            os.link(source / table / name, target / table / name)
    return target


def open_and_read(directory: Path) -> tuple[float, int]:
    start = time.perf_counter()
    writer = TranscriptWriter(directory, compact_at=None)
    rows = read_negotiations(directory).height + read_turns(directory).height
    elapsed = time.perf_counter() - start
    assert len(writer.completed_ids()) <= rows
    return elapsed, rows


def index_per_file(directory: Path) -> float:
    """The index as it was built before: one scan per part file with a literal part column, concatenated."""
    start = time.perf_counter()
    scans = [
        pl.scan_parquet(str(p), schema=NEGOTIATIONS_SCHEMA, missing_columns="insert").with_columns(
            pl.lit(span.lo, pl.Int64).alias("part")
        )
        for span, p in part_files(directory, "negotiations").items()
    ]
    pl.concat(scans).group_by("negotiation_id").agg(
        pl.col("attempt", "end_reason", "part").sort_by("attempt").last()
    ).collect()
    return time.perf_counter() - start


def files(directory: Path) -> int:
    return len(part_files(directory, "negotiations")) + len(part_files(directory, "turns"))


def long_run(directory: Path, played: list[tuple[Job, NegotiationResult]], compact_at: int | None) -> float:
    """The real writer flushing after every negotiation; prints its part counts and returns the time per flush."""
    most = 0
    start = time.perf_counter()
    with TranscriptWriter(directory, flush_every=1, compact_at=compact_at) as writer:
        for job, result in played:
            writer.add(job, 0, result, 0.0)
            most = max(most, len(part_files(directory, "negotiations")))
    per_flush = (time.perf_counter() - start) / len(played)
    n = len(played)
    assert read_negotiations(directory).height == n
    label = "compaction off" if compact_at is None else f"compaction on (fan-out {compact_at})"
    bound = "" if compact_at is None else f" (bound {(compact_at - 1) * (1 + math.floor(math.log(n, compact_at)))})"
    print(
        f"{label}, {n} flushes of one negotiation: at most {most} parts at any time{bound}, "
        f"{len(part_files(directory, 'negotiations'))} at the end ({files(directory)} files); "
        f"{per_flush * 1e3:.2f} ms per flush"
    )
    return per_flush


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,500,1000,2000,5000,10000", help="parts per folder")
    parser.add_argument("--contrast-max", type=int, default=1000, help="largest folder for the per-file index")
    parser.add_argument("--flushes", type=int, default=3000, help="negotiations of the long run, one part each")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    print(f"machine: {platform.machine()}, {len(os.sched_getaffinity(0))} usable CPUs, polars {pl.__version__}")
    played = play(max(sizes[-1], args.flushes))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        write_parts(root / "all", played[: sizes[-1]])
        print(f"wrote {sizes[-1]} one-negotiation parts in {time.perf_counter() - start:.1f} s\n")
        print(f"{'parts':>7} {'rows':>8} {'open+read s':>12} {'ms/part':>8}   {'per-file index s':>16} {'ms/part':>8}")
        per_part = []
        for n in sizes:
            folder = linked(root / "all", root / f"n{n}", n)
            elapsed, rows = open_and_read(folder)
            per_part.append(elapsed / n)
            contrast = ""
            if n <= args.contrast_max:
                old = index_per_file(folder)
                contrast = f"   {old:16.2f} {old / n * 1e3:8.3f}"
            print(f"{n:7d} {rows:8d} {elapsed:12.2f} {elapsed / n * 1e3:8.3f}{contrast}")
        print(f"per-part time, {sizes[-1]} parts / {sizes[0]} parts: {per_part[-1] / per_part[0]:.2f}\n")
        on = long_run(root / "long-on", played[: args.flushes], COMPACT_AT)
        off = long_run(root / "long-off", played[: args.flushes], None)
        print(f"time per flush, compaction on / off: {on / off:.2f}\n")
        start = time.perf_counter()
        writer = TranscriptWriter(root / "all")
        elapsed = time.perf_counter() - start
        assert len(writer.completed_ids()) == sizes[-1] == read_negotiations(root / "all").height
        print(
            f"the {sizes[-1]}-part folder opened with compaction on: {elapsed:.1f} s, "
            f"{len(part_files(root / 'all', 'negotiations'))} parts after"
        )


if __name__ == "__main__":
    main()
