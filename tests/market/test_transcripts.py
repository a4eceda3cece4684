"""Transcripts: round trip, schemas, latest attempts, repair of interrupted writes, resume and kill-and-resume, and
compaction (rows kept once through merges, rollbacks and kills at every step of them; bounded part counts)."""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path

import polars as pl
from nego.market.marketplace import Job, Marketplace
from nego.market.transcript_rows import NEGOTIATIONS_SCHEMA, SCHEMA_VERSION, TIMING_COLUMNS, TURNS_SCHEMA
from nego.market.transcripts import TranscriptWriter, load_results, read_negotiations, read_turns

from ..conftest import make_widget_scenario
from .fakes import BrokenFactory, Factory, factories
from .kill import run_killable
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
    """The killable run; with ``kill_at``, SIGKILLed ``pause`` s after its ``kill_at``-th finished negotiation. True
    if it was killed before it finished."""
    return run_killable([str(directory), str(n), "1" if fail else "0"], kill_at, pause)[0]


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


async def test_rows_buffered_as_tuples_make_the_table_that_rows_by_column_name_make():
    from nego.market.transcript_rows import frame_of, negotiation_row, negotiation_values, turn_rows, turn_values

    specs = {**factories("a", "b", invalid_first=True, tokens=7), "broken": BrokenFactory()}
    jobs = [*jobs_for(6), *(Job(make_widget_scenario(), "broken", "b", seed=i, step=i) for i in range(2))]
    results = await Marketplace(specs).run(jobs)
    rewards = [None, 0.25, -1.0, None, 1.0, 0.5, None, 0.0]
    played = list(enumerate(zip(jobs, results, rewards, strict=True)))
    named = pl.DataFrame(
        [negotiation_row(j, k, r, 0.1 * k, w) for k, (j, r, w) in played], schema=NEGOTIATIONS_SCHEMA, orient="row"
    )
    tuples = frame_of([negotiation_values(j, k, r, 0.1 * k, w) for k, (j, r, w) in played], NEGOTIATIONS_SCHEMA)
    assert tuples.equals(named) and tuples.schema == NEGOTIATIONS_SCHEMA
    assert named["end_reason"].to_list().count("error") == 2 and named["seller_prompt_tokens"].sum() > 0
    by_name = [row for j, r in zip(jobs, results, strict=True) for row in turn_rows(j.negotiation_id, 1, r.turns)]
    by_tuple = [row for j, r in zip(jobs, results, strict=True) for row in turn_values(j.negotiation_id, 1, r.turns)]
    turns = frame_of(by_tuple, TURNS_SCHEMA)
    assert turns.equals(pl.DataFrame(by_name, schema=TURNS_SCHEMA, orient="row")) and turns.schema == TURNS_SCHEMA
    assert turns["valid"].to_list().count(False) > 0 and turns["prompt_tokens"].null_count() < turns.height
    assert frame_of([], TURNS_SCHEMA).schema == TURNS_SCHEMA  # nothing buffered: an empty table of the schema
