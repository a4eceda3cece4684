"""One evaluation split over launcher jobs (``nego eval --shards K --launcher KIND``), merged back into one run.

Shard ``i`` of ``K`` plays the planned negotiations whose place in the plan is ``i`` modulo ``K`` (so every shard
plays its share of every arm), each with its own seed, into its own run directory ``OUT/shards/I-of-K/`` (``I`` counts
from 1) with the marketplace's resumable transcripts; the submitting process waits for the jobs, copies their
transcripts into ``OUT/transcripts`` and computes the statistics from there with the same code as an unsharded run,
so ``OUT`` holds what ``nego eval`` without ``--shards`` writes.

Resuming: a shard whose negotiations all ended without error is not submitted again; before an unfinished shard is
submitted, the attempts ``OUT/transcripts`` already holds of its negotiations are copied into its directory, so it
plays only what is missing and numbers a retried attempt after them. The merge copies each attempt (negotiation id and
attempt number) that ``OUT`` lacks, one part per shard, so a merge killed at any point and run again gives the same
``OUT``. A shard job is one submitit job (:mod:`.launchers`; a job array on SLURM); what it did is read from its
directory, never from its return value.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import polars as pl
from nego.agents.threads import set_threads
from nego.market.locks import DirectoryBusy, exclusive_run
from nego.market.marketplace import FactorySource
from nego.market.transcripts import TranscriptWriter, read_negotiations

from . import launchers
from .config import EvalConfig, ShardConfig
from .runner import (
    EvalResult,
    PlannedJob,
    RunPlan,
    plan_run,
    play,
    summarize,
    warn_of_errors,
    worker_pool,
    write_manifest,
)

SHARDS = "shards"
"""The folder of ``OUT`` that holds the shards' run directories (and, by default, the launcher's ``jobs/``)."""

POLL_S = 1.0
"""How often the state of jobs submitted by an earlier run is asked while waiting for them."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` (from 0) of ``count``."""

    index: int
    count: int

    @property
    def name(self) -> str:
        return f"{self.index + 1}-of-{self.count}"

    def directory(self, out: Path) -> Path:
        return out / SHARDS / self.name

    def take(self, items: Sequence[T]) -> tuple[T, ...]:
        """The items of this shard: those whose place in ``items`` is ``index`` modulo ``count``."""
        return tuple(items[self.index :: self.count])


def split(count: int, negotiations: int) -> list[Shard]:
    """The ``count`` shards of a run of ``negotiations``; each gets at least one (ValueError otherwise)."""
    if count < 1:
        raise ValueError(f"--shards must be >= 1, got {count}")
    if count > negotiations:
        raise ValueError(f"--shards {count} is more than the {negotiations} negotiations this evaluation plans")
    return [Shard(i, count) for i in range(count)]


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a shard's directory is: its planned negotiations, how many have an attempt in its transcripts, and how
    many of those latest attempts ended in an error."""

    planned: int
    written: int
    errors: int

    @property
    def played(self) -> bool:
        """Every negotiation was played (some may have ended in an error): the shard can be merged."""
        return self.written == self.planned

    @property
    def complete(self) -> bool:
        """Every negotiation ended without error: a rerun does not submit the shard again."""
        return self.played and not self.errors


def progress(directory: Path, ids: Iterable[str]) -> Progress:
    wanted = pl.Series(list(ids), dtype=pl.String)
    latest = read_negotiations(directory / "transcripts", latest=True).filter(pl.col("negotiation_id").is_in(wanted))
    return Progress(wanted.len(), latest.height, int((latest["end_reason"] == "error").sum()))


def _ids(jobs: Iterable[PlannedJob]) -> list[str]:
    return [p.job.negotiation_id for p in jobs]


def play_shard_job(directory: Path, config: EvalConfig, jobs: Sequence[PlannedJob], factories: FactorySource) -> str:
    """What a shard's launcher job runs: play ``jobs`` into the run directory ``directory`` (``config`` says how, its
    ``out`` is ``directory``) under that directory's lock. A failure is left in ``error.log`` there (with its
    traceback), named on the job's stderr and returned as text rather than raised, so that every launcher, the
    in-process one too, treats it alike."""
    error_log = directory / launchers.ERROR_LOG
    try:
        with exclusive_run(directory, f"nego eval shard {directory} on {socket.gethostname()}"):
            error_log.unlink(missing_ok=True)
            try:
                set_threads(config.threads)
                with worker_pool(config, factories) as pool:
                    played = asyncio.run(play(config, factories, jobs, pool=pool))
            except Exception as e:
                launchers.write_error_log(directory, e)
                summary = launchers.error_summary(directory)
                print(f"{directory}: failed: {summary} (traceback: {error_log})", file=sys.stderr, flush=True)
                return f"failed: {summary}"
    except DirectoryBusy as e:  # a job of an earlier submission still plays this shard
        print(f"{directory}: not run: {e}", file=sys.stderr, flush=True)
        return f"not run: {e}"
    except Exception as e:  # the directory could not be held at all
        traceback.print_exc()
        return f"failed: {type(e).__name__}: {e}"
    print(f"{directory}: {played} negotiation(s) played now", flush=True)
    return "finished"


@dataclass(frozen=True, slots=True)
class ShardReport:
    """A shard that did not play all its negotiations: what happened and where its log is."""

    shard: str
    detail: str
    log: str | None = None

    def line(self) -> str:
        return f"shard {self.shard}: {self.detail}" + (f" (log: {self.log})" if self.log else "")


class ShardsFailed(RuntimeError):
    """Some shards did not play all their negotiations, so no statistics were computed. What the others played is
    merged into ``OUT``; a rerun submits only the unfinished shards, which resume from their transcripts."""

    def __init__(self, failed: Sequence[ShardReport], total: int) -> None:
        self.failed, self.total = tuple(failed), total
        lines = [f"{len(self.failed)} of {total} shards did not play all their negotiations:"]
        lines += [f"  {r.line()}" for r in self.failed]
        lines.append(
            "The statistics are computed once every shard has played; rerun the same command to run the unfinished "
            "shards again (they resume, finished shards are kept)."
        )
        super().__init__("\n".join(lines))


def evaluate_sharded(
    config: EvalConfig,
    sharding: ShardConfig,
    factories: FactorySource,
    echo: Callable[[str], None] = print,
) -> EvalResult:
    """Run (or resume) ``config`` as ``sharding.count`` launcher jobs, merge their transcripts into ``config.out`` and
    compute the statistics there as :func:`~.runner.evaluate` does. ``factories`` goes to every job (give a
    picklable resolver, such as ``functools.partial(resolve, settings=...)``). Raises :class:`ShardsFailed` when a
    shard did not play all its negotiations."""
    run = plan_run(config, factories)
    shards = split(sharding.count, len(run.jobs))
    with exclusive_run(config.out, f"nego eval --out {config.out} --shards {sharding.count}"):
        write_manifest(config, run)
        todo = _unfinished(shards, run, config.out, echo)
        failed = _launch(todo, run, config, sharding, factories, echo) if todo else []
        played = merge(shards, run, config.out)
        if failed:
            raise ShardsFailed(failed, len(shards))
        with worker_pool(config, factories) as pool:  # the gaps, on this machine
            result = summarize(config, run, factories, played, pool)
    warn_of_errors(result)
    return result


def _unfinished(shards: Sequence[Shard], run: RunPlan, out: Path, echo: Callable[[str], None]) -> list[Shard]:
    """The shards to submit: every one not complete, once no job of an earlier submission still holds it or has it
    queued (those are waited for)."""
    left = []
    for shard in shards:
        if progress(shard.directory(out), _ids(shard.take(run.jobs))).complete:
            echo(f"shard {shard.name}: finished before")
        else:
            left.append(shard)
    _wait_for_earlier_jobs(left, out, echo)
    todo = []
    for shard in left:
        directory = shard.directory(out)
        now = progress(directory, _ids(shard.take(run.jobs)))
        if now.complete:
            echo(f"shard {shard.name}: finished by its earlier job")
            continue
        summary = launchers.error_summary(directory)
        if summary is not None:
            echo(f"shard {shard.name}: failed before ({summary}); running it again")
        elif now.errors:
            echo(f"shard {shard.name}: {now.errors} negotiation(s) ended in an error; playing them again")
        todo.append(shard)
    return todo


def _wait_for_earlier_jobs(shards: Sequence[Shard], out: Path, echo: Callable[[str], None]) -> None:
    """Wait while a live job holds a shard's directory or the launcher has its recorded job queued or running."""
    records = [launchers.JobRecord.read(s.directory(out)) for s in shards]
    told: set[str] = set()
    while True:
        busy = False
        for shard, record, active in zip(shards, records, launchers.still_active(records), strict=True):
            who = launchers.holder(shard.directory(out))
            if who is None and record is not None and active is None and shard.name not in told:
                told.add(shard.name)
                echo(
                    f"shard {shard.name}: cannot tell whether {record.kind} job {record.job_id} is still queued; "
                    "running it again"
                )
            if who is None and not active:
                continue
            busy = True
            if shard.name not in told:
                told.add(shard.name)
                what = f"held by {who}" if who else f"{record.kind} job {record.job_id} queued or running"
                echo(f"shard {shard.name}: {what} from an earlier submission; waiting for it")
        if not busy:
            return
        time.sleep(POLL_S)


def _launch(
    todo: Sequence[Shard],
    run: RunPlan,
    config: EvalConfig,
    sharding: ShardConfig,
    factories: FactorySource,
    echo: Callable[[str], None],
) -> list[ShardReport]:
    """Seed each shard's directory from ``OUT``'s transcripts, submit one job per shard and wait for them all;
    returns the shards that did not play all their negotiations."""
    launcher = sharding.launcher
    folder = launcher.folder or config.out / SHARDS / "jobs"
    executor = launchers.make_executor(launcher, folder, name=f"nego-eval-{config.out.name}")
    calls = []
    for shard in todo:
        directory = shard.directory(config.out)
        jobs = shard.take(run.jobs)
        with (
            exclusive_run(directory, f"nego eval --out {config.out} (copying in its attempts)"),
            TranscriptWriter(directory / "transcripts") as writer,
        ):
            writer.copy_from(config.out / "transcripts", _ids(jobs))
        (directory / launchers.ERROR_LOG).unlink(missing_ok=True)
        calls.append((directory, replace(config, out=directory), jobs, factories))
    submitted = launchers.submit(executor, launcher.kind, play_shard_job, calls)
    for shard, s in zip(todo, submitted, strict=True):
        s.record.write(shard.directory(config.out))
    ids = ", ".join(s.record.job_id for s in submitted)
    echo(f"submitted {len(todo)} shard(s) to {launcher.kind} as job(s) {ids}; logs under {folder}")
    failed = []
    for i in launchers.as_finished([s.job for s in submitted]):
        report = _ended(todo[i], submitted[i], run, config.out)
        if report is None:
            echo(f"shard {todo[i].name}: finished")
        else:
            echo(report.line())
            failed.append(report)
    return failed


def _ended(shard: Shard, submitted: launchers.Submitted, run: RunPlan, out: Path) -> ShardReport | None:
    """None for a shard whose job played all its negotiations, otherwise what went wrong (from its directory and the
    job's log)."""
    directory = shard.directory(out)
    now = progress(directory, _ids(shard.take(run.jobs)))
    if now.played:
        return None
    log = submitted.record.stderr
    summary = launchers.error_summary(directory)
    if summary is not None:
        return ShardReport(shard.name, f"failed: {summary} (traceback: {directory / launchers.ERROR_LOG})", log)
    state = launchers.job_state(submitted.job)
    detail = f"the job ended with {now.written} of {now.planned} negotiations played (state {state})"
    return ShardReport(shard.name, detail + launchers.last_line(log), log)


def merge(shards: Sequence[Shard], run: RunPlan, out: Path) -> int:
    """Copy into ``OUT/transcripts`` the attempts of every shard that played all its negotiations (only those of
    negotiations it plans) that ``OUT`` lacks; returns how many came in."""
    merged = 0
    with TranscriptWriter(out / "transcripts") as writer:
        for shard in shards:
            directory, ids = shard.directory(out), _ids(shard.take(run.jobs))
            if progress(directory, ids).played:
                merged += writer.copy_from(directory / "transcripts", ids)
    return merged
