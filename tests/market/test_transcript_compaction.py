"""Compaction of transcript parts: parts merged into one that covers their numbers, kills at every step of a merge,
rollbacks through merged parts, readers racing a merge, bounded part counts."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from nego.market.marketplace import Job, Marketplace
from nego.market.transcripts import TranscriptWriter, load_results, read_negotiations, read_turns
from nego.market.types import NegotiationResult

from .fakes import BrokenFactory, Factory, factories
from .test_transcripts import ROOT, _canonical, jobs_for

Add = tuple[Job, int, NegotiationResult]


async def history(n: int) -> list[Add]:
    """Attempts as a resumed run writes them: every third job fails first and is played again at the end."""
    jobs = jobs_for(n)
    good = await Marketplace(factories("a", "b", tokens=3)).run(jobs)
    bad = await Marketplace({"a": BrokenFactory("a"), "b": Factory("b")}).run(jobs)
    first = [(job, 0, bad[i] if i % 3 == 0 else good[i]) for i, job in enumerate(jobs)]
    return first + [(job, 1, good[i]) for i, job in enumerate(jobs) if i % 3 == 0]


def write(directory: Path, adds: list[Add], **options) -> TranscriptWriter:
    with TranscriptWriter(directory, flush_every=1, **options) as writer:
        for i, (job, attempt, result) in enumerate(adds):
            writer.add(job, attempt, result, wall_s=float(i))
    return writer


def names(directory: Path, table: str = "negotiations") -> list[str]:
    return sorted(p.name for p in (directory / table).iterdir() if not p.name.startswith("."))


def assert_same_rows(directory: Path, reference: Path) -> None:
    for latest in (False, True):
        assert read_negotiations(directory, latest=latest).equals(read_negotiations(reference, latest=latest))
        assert read_turns(directory, latest=latest).equals(read_turns(reference, latest=latest))


async def test_compaction_keeps_every_row_once_and_every_reader_reads_the_same(tmp_path):
    adds = await history(30)
    plain = write(tmp_path / "plain", adds, compact_at=None)
    compacted = write(tmp_path / "compacted", adds, compact_at=3)
    assert len(names(tmp_path / "plain")) == 40
    assert names(tmp_path / "compacted") == [  # 40 = 27 + 9 + 3 + 1
        "part-00000000-00000026.parquet",
        "part-00000027-00000035.parquet",
        "part-00000036-00000038.parquet",
        "part-00000039.parquet",
    ]
    assert names(tmp_path / "compacted", "turns") == names(tmp_path / "compacted")
    assert_same_rows(tmp_path / "compacted", tmp_path / "plain")
    assert compacted.attempts() == plain.attempts()
    ids = [job.negotiation_id for job, _, _ in adds[:30]]
    reopened = TranscriptWriter(tmp_path / "compacted", compact_at=3)
    assert reopened.attempts() == plain.attempts() and reopened.leftovers == 0
    assert reopened.load_results(ids) == compacted.load_results(ids) == load_results(tmp_path / "plain", ids)
    keys = ["negotiation_id", "attempt"]
    assert reopened.completed_rows("r1").sort(keys).equals(plain.completed_rows("r1").sort(keys))


async def test_opening_a_folder_of_many_small_parts_merges_them_in_one_pass_per_tier(tmp_path):
    adds = (await history(30))[:26]
    write(tmp_path / "plain", adds, compact_at=None)
    shutil.copytree(tmp_path / "plain", tmp_path / "opened")
    writer = TranscriptWriter(tmp_path / "opened", compact_at=3)
    assert names(tmp_path / "opened") == [  # 26 = 2 x 9 + 2 x 3 + 2
        "part-00000000-00000008.parquet",
        "part-00000009-00000017.parquet",
        "part-00000018-00000020.parquet",
        "part-00000021-00000023.parquet",
        "part-00000024.parquet",
        "part-00000025.parquet",
    ]
    assert_same_rows(tmp_path / "opened", tmp_path / "plain")
    assert writer.latest(adds[10][0].negotiation_id).part == 9  # a compacted part is read as its first number


async def test_the_part_count_stays_bounded_over_many_flushes(tmp_path):
    adds = await history(30)
    fanout, most = 3, 0
    with TranscriptWriter(tmp_path, flush_every=1, compact_at=fanout) as writer:
        for n in range(1, 201):
            job, attempt, result = adds[n % len(adds)]
            writer.add(replace(job, negotiation_id=f"{job.negotiation_id}-{n}"), attempt, result, 0.0)
            count = len(names(tmp_path))
            assert count <= (fanout - 1) * (1 + int(math.log(n, fanout) + 1e-9))
            most = max(most, count)
    assert most > fanout and len(names(tmp_path, "turns")) == len(names(tmp_path))
    assert read_negotiations(tmp_path).height == 200


def _kill_at(monkeypatch, after: int) -> list[str]:
    """Make the ``after``-th rename or unlink from here on raise, as a kill there would stop the writer; returns the
    operations done (before the kill)."""
    done: list[str] = []
    real_replace, real_unlink = os.replace, os.unlink

    class Killed(BaseException):
        pass

    def step(name: str, real, *args):
        if len(done) == after:
            raise Killed(name)
        done.append(f"{name} {Path(args[-1]).parent.name}/{Path(args[-1]).name}")
        return real(*args)

    monkeypatch.setattr(os, "replace", lambda src, dst: step("replace", real_replace, src, dst))
    monkeypatch.setattr(os, "unlink", lambda path: step("unlink", real_unlink, path))
    return done


@pytest.fixture(scope="module")
def four_parts(tmp_path_factory) -> Path:

    directory = tmp_path_factory.mktemp("four")
    write(directory, asyncio.run(history(4)), compact_at=None)  # 4 jobs, two played again: parts 0 to 5
    return directory


@pytest.mark.parametrize("after", range(13))
def test_a_kill_at_any_step_of_a_compaction_leaves_every_row_exactly_once(tmp_path, monkeypatch, four_parts, after):
    directory = tmp_path / "d"
    shutil.copytree(four_parts, directory)
    done = _kill_at(monkeypatch, after)
    try:
        TranscriptWriter(directory, compact_at=4)  # opening merges parts 0 to 3
    except BaseException as e:
        assert type(e).__name__ == "Killed"
    monkeypatch.undo()
    merged = "part-00000000-00000003.parquet"
    assert done[:2] == [f"replace turns/{merged}", f"replace negotiations/{merged}"][: len(done)]
    assert len(done) == min(after, 10)
    assert_same_rows(directory, four_parts)  # before any repair: readers skip what the merge left
    writer = TranscriptWriter(directory, compact_at=None)
    sources_left = 4 - max(0, after - 2) // 2 if after >= 2 else 0
    assert writer.repairs == {"tmp": 1 if after < 2 else 0, "orphan_turns": 0, "unreadable": 0}
    assert writer.leftovers == (1 if after == 1 else sources_left if after < 10 else 0)
    assert names(directory) == names(directory, "turns")
    assert names(directory) == ([merged] if after >= 2 else [f"part-0000000{n}.parquet" for n in range(4)]) + [
        "part-00000004.parquet",
        "part-00000005.parquet",
    ]
    assert_same_rows(directory, four_parts)
    assert len(writer.completed_ids()) == 4


async def stepped(directory: Path, steps: int) -> None:
    """One part per training step (a negotiation each), merged by fours: parts 0-3, 4-7, then 8 and 9."""
    results = await Marketplace(factories("a", "b")).run(jobs_for(steps))
    with TranscriptWriter(directory, flush_every=1, compact_at=4) as writer:
        for step, (job, result) in enumerate(zip(jobs_for(steps), results, strict=True)):
            writer.add(replace(job, step=step), 0, result, 0.0)


@pytest.mark.parametrize("after", range(10))
async def test_a_rollback_through_a_compacted_part_survives_a_kill_at_any_step(tmp_path, monkeypatch, after):
    await stepped(tmp_path / "ref", 10)
    shutil.copytree(tmp_path / "ref", tmp_path / "d")
    assert names(tmp_path / "d") == [
        "part-00000000-00000003.parquet",
        "part-00000004-00000007.parquet",
        "part-00000008.parquet",
        "part-00000009.parquet",
    ]
    writer = TranscriptWriter(tmp_path / "d", compact_at=4)
    done = _kill_at(monkeypatch, after)
    try:
        removed = writer.rollback(pl.col("step") >= 6, "after step 5")
    except BaseException as e:
        assert type(e).__name__ == "Killed"
    else:
        assert removed == 4 and after >= 8
    monkeypatch.undo()
    assert len(done) == min(after, 8)  # two renames of part 4-10, then the three parts it replaces
    everything = read_negotiations(tmp_path / "ref")
    kept = everything.filter(pl.col("step") < 6)
    seen = read_negotiations(tmp_path / "d")
    assert seen.equals(kept if after >= 2 else everything)  # each row once, before or after the rollback
    writer = TranscriptWriter(tmp_path / "d", compact_at=4)
    assert writer.rollback(pl.col("step") >= 6, "after step 5") == (4 if after < 2 else 0)
    assert read_negotiations(tmp_path / "d").equals(kept)
    turns = read_turns(tmp_path / "ref").filter(pl.col("negotiation_id").is_in(kept["negotiation_id"].implode()))
    assert read_turns(tmp_path / "d").equals(turns)
    assert names(tmp_path / "d") == ["part-00000000-00000003.parquet", "part-00000004-00000010.parquet"]
    assert set(writer.completed_ids()) == set(kept["negotiation_id"])


async def test_a_rollback_still_refuses_a_part_as_written_that_mixes_both_sides(tmp_path):
    results = await Marketplace(factories("a", "b")).run(jobs_for(4))
    with TranscriptWriter(tmp_path, flush_every=2) as writer:
        for step, (job, result) in enumerate(zip(jobs_for(4), results, strict=True)):
            writer.add(replace(job, step=step), 0, result, 0.0)
    with pytest.raises(ValueError, match=r"part-00000001\.parquet holds negotiations on both sides"):
        writer.rollback(pl.col("step") >= 3, "after step 2")
    assert read_negotiations(tmp_path).height == 4


async def test_two_compacting_writers_keep_each_others_rows_and_read_back_their_own(tmp_path):
    adds = await history(12)
    one, two = TranscriptWriter(tmp_path, flush_every=1, compact_at=2), TranscriptWriter(tmp_path, compact_at=2)
    for i, (job, attempt, result) in enumerate(adds):
        (one if i % 2 else two).add(job, attempt, result, float(i))
        two.flush()
    write(tmp_path / "plain", adds, compact_at=None)
    assert_same_rows(tmp_path, tmp_path / "plain")
    assert len(names(tmp_path)) <= 4  # 16 parts, merged by either writer
    ids = [adds[i][0].negotiation_id for i in (1, 5, 7, 11)]  # written by one, never played again
    assert one.load_results(ids) == load_results(tmp_path / "plain", ids)  # parts it wrote were merged by two


async def test_a_reader_reads_again_when_a_compaction_replaces_what_it_listed(tmp_path, monkeypatch):
    from nego.market import transcripts

    adds = await history(6)
    write(tmp_path / "d", adds, compact_at=None)
    write(tmp_path / "plain", adds, compact_at=None)
    listings = []
    real = transcripts.visible

    def listing_then_compaction(directory):
        parts = real(directory)
        listings.append(parts)
        if len(listings) == 1:
            monkeypatch.setattr(transcripts, "visible", real)
            TranscriptWriter(directory, compact_at=2)  # merges and deletes every part just listed
            monkeypatch.setattr(transcripts, "visible", listing_then_compaction)
        return parts

    expected = read_turns(tmp_path / "plain")
    monkeypatch.setattr(transcripts, "visible", listing_then_compaction)
    assert read_turns(tmp_path / "d").equals(expected)
    assert len(listings) == 4  # listed, changed (the read failed): listed again, unchanged
    assert names(tmp_path / "d") == ["part-00000000-00000007.parquet"]


async def test_opening_many_parts_with_unreadable_ones_repairs_them_and_compacts_the_rest(tmp_path, caplog):
    adds = (await history(30))[:30]
    write(tmp_path, adds, compact_at=None)
    neg_dir, turns_dir = tmp_path / "negotiations", tmp_path / "turns"
    for path in (neg_dir / "part-00000003.parquet", turns_dir / "part-00000017.parquet"):
        path.write_bytes(path.read_bytes()[:-9])  # cut in its footer
    with caplog.at_level(logging.WARNING):
        writer = TranscriptWriter(tmp_path, compact_at=4)
    # part 3's turns lost their negotiations part (an orphan); part 17's negotiations part lost its turns part
    assert writer.repairs == {"tmp": 0, "orphan_turns": 1, "unreadable": 3}
    assert "1 turns part(s) without a negotiations part and 3 unreadable part(s)" in caplog.text
    ids = [job.negotiation_id for job, _, _ in adds]
    assert set(writer.attempts()) == set(ids) - {ids[3], ids[17]}
    assert writer.completed_ids() == {nid for i, nid in enumerate(ids) if i % 3 and i != 17}
    assert read_negotiations(tmp_path).height == 28
    assert names(tmp_path) == [  # 28 parts: the first 16 (numbers 0 to 16), then three of four
        "part-00000000-00000016.parquet",
        "part-00000018-00000021.parquet",
        "part-00000022-00000025.parquet",
        "part-00000026-00000029.parquet",
    ]


async def test_a_killed_writer_that_compacts_after_every_flush_resumes_to_exactly_one_row_per_job(tmp_path):
    n, rng = 80, random.Random(7)
    script = (
        "import asyncio, sys\n"
        "from nego.market.marketplace import Marketplace\n"
        "from nego.market.transcripts import TranscriptWriter\n"
        "from tests.market.fakes import factories\n"
        "from tests.market.killable_run import make_jobs\n"
        "print('ready', flush=True)\n"
        "writer = TranscriptWriter(sys.argv[1], flush_every=1, compact_at=2)\n"
        "asyncio.run(Marketplace(factories('flaky', 'a', 'b'), writer=writer).run(make_jobs(int(sys.argv[2]))))\n"
    )

    def run(directory: Path, kill_after: float | None) -> bool:
        cmd = [sys.executable, "-c", script, str(directory), str(n)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        if kill_after is not None:
            time.sleep(kill_after)
            proc.send_signal(signal.SIGKILL)
        code = proc.wait(timeout=120)
        assert code in (0, -signal.SIGKILL)
        return code == -signal.SIGKILL

    killed = 0
    for _ in range(4):
        killed += run(tmp_path / "killed", rng.uniform(0.05, 0.2))
        assert read_negotiations(tmp_path / "killed")["negotiation_id"].is_duplicated().sum() == 0
        turns = read_turns(tmp_path / "killed").select("negotiation_id", "index")
        assert turns.is_duplicated().sum() == 0  # every written row once, wherever the kill fell
    assert killed >= 3  # the kills really interrupted runs
    run(tmp_path / "killed", None)
    run(tmp_path / "reference", None)
    assert _canonical(read_negotiations(tmp_path / "killed")).equals(
        _canonical(read_negotiations(tmp_path / "reference"))
    )
    assert _canonical(read_turns(tmp_path / "killed")).equals(_canonical(read_turns(tmp_path / "reference")))
