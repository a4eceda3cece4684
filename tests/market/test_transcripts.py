"""Transcripts: round trip, schemas, latest attempts, repair of interrupted writes, resume and kill-and-resume, and
compaction (rows kept once through merges, rollbacks and kills at every step of them; bounded part counts)."""

from __future__ import annotations

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
from nego.market.transcript_rows import NEGOTIATIONS_SCHEMA, SCHEMA_VERSION, TIMING_COLUMNS, TURNS_SCHEMA
from nego.market.transcripts import TranscriptWriter, load_results, read_negotiations, read_turns
from nego.market.types import NegotiationResult

from ..conftest import make_widget_scenario
from .fakes import BrokenFactory, Factory, factories
from .killable_run import make_jobs

ROOT = Path(__file__).resolve().parents[2]


def jobs_for(n: int, seller: str = "a") -> list[Job]:
    sc = make_widget_scenario()
    return [Job(sc, seller, "b", seed=i, run_id="r1", arm="base", day=2, pair=i) for i in range(n)]


async def test_round_trip_rebuilds_identical_results(tmp_path):
    specs = factories("a", "b", invalid_first=True, tokens=7)
    jobs = jobs_for(9)
    with TranscriptWriter(tmp_path, flush_every=4) as writer:
        results = await Marketplace(specs, writer=writer).run(jobs)
    assert writer.written == 9 and len(list((tmp_path / "negotiations").glob("part-*.parquet"))) == 3
    neg, turns = read_negotiations(tmp_path), read_turns(tmp_path)
    assert neg.schema == NEGOTIATIONS_SCHEMA and turns.schema == TURNS_SCHEMA
    assert neg["schema_version"].unique().to_list() == [SCHEMA_VERSION]
    assert neg["seller_prompt_tokens"].sum() == sum(r.usage_seller.prompt_tokens for r in results) > 0
    assert neg["invalid_seller"].sum() == 9 and neg["arm"].unique().to_list() == ["base"]
    assert turns.height == sum(len(r.turns) for r in results)
    assert turns.filter(~pl.col("valid"))["feedback"].str.contains("could not parse").all()
    back = load_results(tmp_path, [j.negotiation_id for j in jobs])
    assert [back[j.negotiation_id] for j in jobs] == results


async def test_resume_skips_completed_and_replays_errors_as_next_attempt(tmp_path):
    sc = make_widget_scenario()
    jobs = [Job(sc, "a" if i % 2 else "flaky", "b", seed=i) for i in range(6)]
    first = {"a": Factory("a"), "b": Factory("b"), "flaky": BrokenFactory("flaky")}
    await Marketplace(first, writer=TranscriptWriter(tmp_path)).run(jobs)
    writer = TranscriptWriter(tmp_path)
    assert writer.completed_ids() == {j.negotiation_id for j in jobs[1::2]}
    second = factories("a", "b", "flaky")
    results = await Marketplace(second, writer=writer).run(jobs)
    assert all(r.outcome.agreed for r in results) and writer.written == 3
    assert len(second["a"].built) == 0  # completed jobs were not played again
    everything = read_negotiations(tmp_path)
    assert everything.height == 9
    latest = read_negotiations(tmp_path, latest=True)
    assert latest.height == 6 and (latest["end_reason"] != "error").all()
    assert sorted(latest.filter(pl.col("seller") == "flaky")["attempt"].to_list()) == [1, 1, 1]
    # turns of the latest attempt only: the error attempts had none to begin with
    assert read_turns(tmp_path, latest=True).height == latest["turns"].sum()


def test_interrupted_writes_are_repaired_with_a_logged_count(tmp_path, caplog):
    from nego.market.marketplace import run_jobs

    run_jobs(factories("a", "b"), jobs_for(6), writer=TranscriptWriter(tmp_path, flush_every=2))
    neg_dir, turns_dir = tmp_path / "negotiations", tmp_path / "turns"
    # a crash between the two renames: part 2's turns are in place, its negotiations part is not
    os.remove(neg_dir / "part-00000002.parquet")
    # a crash while writing: a temporary file
    (turns_dir / ".part-00000003.parquet.tmp").write_bytes(b"PAR1 half")
    # a part damaged on disk (e.g. by a power loss without fsync)
    data = (neg_dir / "part-00000001.parquet").read_bytes()
    (neg_dir / "part-00000001.parquet").write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING):
        writer = TranscriptWriter(tmp_path)
    # part 1's turns lost their (damaged) negotiations part, so they count as orphans too
    assert writer.repairs == {"tmp": 1, "orphan_turns": 2, "unreadable": 1}
    assert "removed 1 temporary file(s), 2 turns part(s)" in caplog.text
    assert sorted(p.name for p in neg_dir.iterdir()) == sorted(p.name for p in turns_dir.iterdir())
    assert len(writer.completed_ids()) == 2
    results = run_jobs(factories("a", "b"), jobs_for(6), writer=writer)
    assert writer.written == 4 and len(results) == 6
    latest = read_negotiations(tmp_path, latest=True)
    assert latest.height == 6 and read_negotiations(tmp_path).height == 6


def test_reader_ignores_a_turns_part_whose_negotiations_part_is_missing(tmp_path):
    from nego.market.marketplace import run_jobs

    run_jobs(factories("a", "b"), jobs_for(4), writer=TranscriptWriter(tmp_path, flush_every=2))
    os.remove(tmp_path / "negotiations" / "part-00000001.parquet")
    neg, turns = read_negotiations(tmp_path), read_turns(tmp_path)
    assert neg.height == 2 and set(turns["negotiation_id"]) == set(neg["negotiation_id"])
    assert (tmp_path / "turns" / "part-00000001.parquet").exists()


async def test_two_writers_on_one_directory_never_overwrite_each_others_parts(tmp_path):
    jobs = jobs_for(8)
    one, two = TranscriptWriter(tmp_path, flush_every=2), TranscriptWriter(tmp_path, flush_every=2)
    results = await Marketplace(factories("a", "b")).run(jobs)
    for i, (job, result) in enumerate(zip(jobs, results, strict=True)):  # interleaved flushes, as two processes
        (one if i % 4 < 2 else two).add(job, 1, result, 0.0)  # sharing a directory would do
    one.close()
    two.close()
    neg = read_negotiations(tmp_path)
    assert sorted(neg["negotiation_id"]) == sorted(j.negotiation_id for j in jobs)
    assert read_turns(tmp_path).height == sum(len(r.turns) for r in results)


def test_empty_directory_reads_as_empty_tables(tmp_path):
    assert read_negotiations(tmp_path).schema == NEGOTIATIONS_SCHEMA
    assert read_turns(tmp_path, latest=True).height == 0
    assert TranscriptWriter(tmp_path).completed_ids() == set()


def _run(directory: Path, n: int, fail: bool, kill_at: int | None, pause: float = 0.0) -> bool:
    """Run the killable script; with ``kill_at``, SIGKILL it ``pause`` s after its ``kill_at``-th finished
    negotiation. True if it was killed before it finished."""
    cmd = [sys.executable, "-m", "tests.market.killable_run", str(directory), str(n), "1" if fail else "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        ended = 0
        while kill_at is not None and ended < kill_at:
            line = proc.stdout.readline().strip()
            if line != "ended":
                break  # "done" or end of output: it finished first
            ended += 1
        if kill_at is not None and ended == kill_at:
            time.sleep(pause)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return proc.returncode == -signal.SIGKILL
        proc.stdout.read()
        assert proc.wait(timeout=120) == 0
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _canonical(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.drop([c for c in TIMING_COLUMNS if c in frame.columns])


def test_killed_runs_resume_to_exactly_one_row_per_job(tmp_path):
    n = 60
    rng = random.Random(20240611)
    directory = tmp_path / "killed"
    killed = [
        _run(directory, n, fail, kill_at=rng.randint(1, 12), pause=rng.uniform(0.0, 0.02))
        for fail in (True, True, False, False)
    ]
    assert sum(killed) >= 3  # the kills really interrupted runs
    _run(directory, n, False, kill_at=None)
    reference = tmp_path / "reference"
    _run(reference, n, False, kill_at=None)

    all_rows = read_negotiations(directory)
    assert all_rows.select("negotiation_id", "attempt").is_duplicated().sum() == 0
    latest = read_negotiations(directory, latest=True)
    assert set(latest["negotiation_id"]) == {j.negotiation_id for j in make_jobs(n)}
    assert latest.height == n and (latest["end_reason"] != "error").all()
    assert all_rows.filter(pl.col("end_reason") != "error").height == n
    # attempts of each id are 0..k without gaps; only the flaky seller ever failed
    gaps = all_rows.group_by("negotiation_id").agg((pl.col("attempt").max() + 1 - pl.len()).alias("gap"))
    assert (gaps["gap"] == 0).all()
    assert set(all_rows.filter(pl.col("end_reason") == "error")["seller"]) <= {"flaky"}
    turns = read_turns(directory)
    assert turns.select("negotiation_id", "attempt", "index").is_duplicated().sum() == 0
    per_attempt = turns.group_by("negotiation_id", "attempt").agg(pl.len().alias("n"), pl.col("index").max())
    joined = all_rows.join(per_attempt, on=["negotiation_id", "attempt"], how="left")
    assert (joined["turns"] == joined["n"].fill_null(0)).all()
    assert turns.join(all_rows, on=["negotiation_id", "attempt"], how="anti").height == 0
    # the resumed transcripts hold exactly what an uninterrupted run writes
    ref = read_negotiations(reference, latest=True).drop("attempt")
    assert _canonical(latest.drop("attempt")).equals(_canonical(ref))
    assert _canonical(read_turns(directory, latest=True).drop("attempt")).equals(
        _canonical(read_turns(reference).drop("attempt"))
    )
    shutil.rmtree(tmp_path)


async def test_a_rerun_reads_back_only_the_parts_that_hold_its_results(tmp_path, monkeypatch):
    jobs = jobs_for(12)
    with TranscriptWriter(tmp_path, flush_every=3) as writer:
        results = await Marketplace(factories("a", "b"), writer=writer).run(jobs)
    writer = TranscriptWriter(tmp_path)  # indexes the directory once, here
    assert writer.latest(jobs[7].negotiation_id).part == 2
    read: list[str] = []
    real = pl.scan_parquet

    def counting(source, **kw):
        read.extend(Path(p).name for p in ([source] if isinstance(source, str) else source))
        return real(source, **kw)

    monkeypatch.setattr(pl, "scan_parquet", counting)
    again = await Marketplace(factories("a", "b"), writer=writer).run(jobs[6:8])
    assert again == results[6:8] and writer.written == 0
    assert sorted(read) == ["part-00000002.parquet"] * 2  # its negotiations and its turns, nothing else


# compaction: parts merged into one that covers their numbers, kills at every step of it, bounded part counts

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
    import asyncio

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
