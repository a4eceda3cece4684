"""``nego eval --shards K --launcher KIND``: shards played in-process (submitit's debug executor) and as local
subprocesses write the transcripts, metrics and printed statistics of the unsharded run; a killed shard and a merge
cut short are completed by a rerun without duplicates; a failed shard is named with its log; bad arguments are
refused."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from nego.agents.registry import resolve
from nego.cli.eval_cmd import eval_
from nego.evaluation import shards as shards_module
from nego.evaluation.config import EvalConfig, LauncherConfig, ShardConfig
from nego.evaluation.launchers import JobRecord
from nego.evaluation.runner import evaluate
from nego.evaluation.shards import Shard, ShardsFailed, evaluate_sharded, split
from nego.market.locks import exclusive_run
from nego.market.transcript_rows import TIMING_COLUMNS
from nego.market.transcripts import TranscriptWriter, read_negotiations, read_turns
from typer.testing import CliRunner

from .fake_shards import KillOnce

SELLERS = "boulware,linear"


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("eval")(eval_)
    app.command("noop")(lambda: None)
    return app


def _eval(out: Path, suite: Path, *extra: str, baselines: str = "tft"):
    args = ["eval", "--sellers", SELLERS, "--suite", str(suite), "--out", str(out), "--resamples", "1000"]
    return CliRunner().invoke(_app(), [*args, "--baselines", baselines, "--concurrency", "4", *extra])


def _timeless(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.drop([c for c in TIMING_COLUMNS if c in frame.columns])


def _written(out: Path) -> dict[str, pl.DataFrame]:
    """What a run directory holds, timing columns aside, in a fixed order."""
    return {
        "negotiations": _timeless(read_negotiations(out / "transcripts")),
        "turns": _timeless(read_turns(out / "transcripts")),
        "metrics": _timeless(pl.read_parquet(out / "metrics.parquet")),
        "gaps": pl.read_parquet(out / "gaps.parquet").sort("negotiation_id", "attempt"),
        "comparisons": pl.read_parquet(out / "comparisons.parquet"),
    }


def _assert_same_run(out: Path, reference: Path) -> None:
    mine, theirs = _written(out), _written(reference)
    for name, frame in theirs.items():
        assert mine[name].equals(frame), name
    ids = mine["negotiations"]["negotiation_id"]
    assert ids.n_unique() == ids.len()  # one attempt each: nothing was played or merged twice
    assert (out / "run.json").read_text() == (reference / "run.json").read_text()


def _statistics(output: str, out: Path) -> str:
    """The printed statistics: from the title line on (progress lines of the shards come before), paths as OUT."""
    start = output.index("suite eval-tiny (hash")
    return output[start:].replace(str(out), "OUT")


@pytest.fixture
def unsharded(tmp_path, tiny_suite_path):
    out = tmp_path / "k1"
    res = _eval(out, tiny_suite_path)
    assert res.exit_code == 0, res.output
    return out, _statistics(res.output, out)


@pytest.mark.parametrize("kind", ["submitit-debug", "submitit-local"])
def test_sharded_evals_write_and_print_what_the_unsharded_eval_does(
    kind, tmp_path, tiny_suite_path, unsharded, submitit_jobs
):
    reference, statistics = unsharded
    for count in (2, 3):
        out = tmp_path / f"k{count}"
        res = _eval(out, tiny_suite_path, "--shards", str(count), "--launcher", kind)
        assert res.exit_code == 0, res.output
        assert f"submitted {count} shard(s) to {kind}" in res.output
        assert _statistics(res.output, out) == statistics
        _assert_same_run(out, reference)
        records = [JobRecord.read(Shard(i, count).directory(out)) for i in range(count)]
        assert {r.kind for r in records} == {kind} and all(Path(r.stdout).is_file() for r in records)
    again = _eval(out, tiny_suite_path, "--shards", "3", "--launcher", kind)
    assert again.exit_code == 0, again.output
    assert "submitted" not in again.output and again.output.count("finished before") == 3
    rerun = _eval(reference, tiny_suite_path)
    assert _statistics(again.output, out) == _statistics(rerun.output, reference)  # "played now: 0"
    _assert_same_run(out, reference)


@given(st.integers(1, 40), st.integers(1, 40))
def test_every_negotiation_goes_to_exactly_one_shard(count, negotiations):
    if count > negotiations:
        with pytest.raises(ValueError, match=f"--shards {count} is more than the {negotiations} negotiations"):
            split(count, negotiations)
        return
    jobs = list(range(negotiations))
    parts = [shard.take(jobs) for shard in split(count, negotiations)]
    assert sorted(j for part in parts for j in part) == jobs
    assert all(part for part in parts) and max(map(len, parts)) - min(map(len, parts)) <= 1
    assert parts == [shard.take(jobs) for shard in split(count, negotiations)]


def _config(out: Path, suite: Path) -> EvalConfig:
    return EvalConfig(sellers=tuple(SELLERS.split(",")), out=out, suite=str(suite), resamples=1_000, concurrency=4)


def test_a_killed_shard_is_named_with_its_log_and_a_rerun_completes_it(tmp_path, tiny_suite_path, submitit_jobs):
    # default baselines: 6 sellers x 24 = 144 negotiations, 72 a shard; the 70th buyer comes after the first flush
    config, sharding = _config(tmp_path / "run", tiny_suite_path), ShardConfig(2, LauncherConfig("submitit-local"))
    factories = KillOnce(str(tmp_path / "killed"), after=70)
    with pytest.raises(ShardsFailed) as info:
        evaluate_sharded(config, sharding, factories, echo=lambda _: None)
    [failure] = info.value.failed
    killed = next(s for s in split(2, 144) if s.name == failure.shard)
    written = read_negotiations(killed.directory(config.out) / "transcripts")
    assert 0 < written.height < 72
    assert f"the job ended with {written.height} of 72 negotiations played" in failure.detail
    assert "about to be killed" in failure.detail  # the last line of the job's log
    assert failure.log == JobRecord.read(killed.directory(config.out)).stderr and Path(failure.log).is_file()
    assert failure.line() in str(info.value) and "rerun the same command" in str(info.value)
    assert read_negotiations(config.out / "transcripts").height == 72  # the finished shard is merged
    assert not (config.out / "metrics.parquet").exists()

    lines: list[str] = []
    result = evaluate_sharded(config, sharding, factories, echo=lines.append)
    other = next(s for s in split(2, 144) if s != killed)
    assert f"shard {other.name}: finished before" in lines and "submitted 1 shard(s) to submitit-local" in lines[1]
    resumed = read_negotiations(killed.directory(config.out) / "transcripts")
    assert resumed.height == resumed["negotiation_id"].n_unique() == 72  # what it had written was not played again
    assert result.played == 72 and result.metrics.height == 144
    evaluate(_config(tmp_path / "fresh", tiny_suite_path), resolve)
    _assert_same_run(config.out, tmp_path / "fresh")


class Interrupted(BaseException):
    """Stands in for a kill: not an Exception, so nothing on the way catches it."""


def test_a_merge_cut_short_and_a_shard_missing_its_last_part_are_completed(
    tmp_path, tiny_suite_path, unsharded, monkeypatch
):
    reference, _ = unsharded
    out = tmp_path / "k3"
    real, merged = TranscriptWriter.copy_from, []

    def copy_from(writer, source, ids=None):
        if writer.directory == out / "transcripts":
            if merged:
                raise Interrupted
            merged.append(source)
        return real(writer, source, ids)

    monkeypatch.setattr(TranscriptWriter, "copy_from", copy_from)
    with pytest.raises(Interrupted):
        _eval(out, tiny_suite_path, "--shards", "3", "--launcher", "submitit-debug")
    monkeypatch.setattr(TranscriptWriter, "copy_from", real)
    assert read_negotiations(out / "transcripts").height == 24  # one shard of three merged
    last = Shard(2, 3).directory(out) / "transcripts" / "negotiations"
    [part] = last.iterdir()  # as a kill between a part's turns and its negotiations leaves it
    part.unlink()

    res = _eval(out, tiny_suite_path, "--shards", "3", "--launcher", "submitit-debug")
    assert res.exit_code == 0, res.output
    assert res.output.count("finished before") == 2 and "submitted 1 shard(s)" in res.output
    assert "played now: 48" in res.output  # the two shards not merged before
    _assert_same_run(out, reference)


class BrokenBuyers:
    """Agents as nego resolves them, except that the first ``broken`` buyers built raise (their negotiations end in
    an error, which a rerun plays again as the next attempt)."""

    def __init__(self, broken: int) -> None:
        self.broken = broken

    def __call__(self, spec: str):
        inner, source = resolve(spec), self

        class Breaking:
            spec, kind = inner.spec, inner.kind

            def __call__(self, role, seed):
                if role.value == "buyer" and source.broken > 0:
                    source.broken -= 1
                    raise RuntimeError("buyer service unavailable")
                return inner(role, seed)

        return Breaking()


def test_a_sharded_rerun_of_an_unsharded_run_plays_what_an_unsharded_rerun_plays(tmp_path, tiny_suite_path):
    runs = {name: replace(_config(tmp_path / name, tiny_suite_path), baselines=()) for name in ("sharded", "plain")}
    for config in runs.values():
        first = evaluate(config, BrokenBuyers(10))
        assert first.metrics["error"].sum() == 10
    sharding = ShardConfig(2, LauncherConfig("submitit-debug"))
    sharded = evaluate_sharded(runs["sharded"], sharding, resolve, echo=lambda _: None)
    plain = evaluate(runs["plain"], resolve)
    assert sharded.played == plain.played == 10 and not sharded.metrics["error"].any()
    for read in (read_negotiations, read_turns):  # every attempt: the errors, then the retries numbered after them
        assert _timeless(read(tmp_path / "sharded" / "transcripts")).equals(
            _timeless(read(tmp_path / "plain" / "transcripts"))
        )
    assert _timeless(sharded.metrics).equals(_timeless(plain.metrics)) and sharded.comparisons.equals(plain.comparisons)


def test_a_failed_shard_is_named_with_its_log_and_no_traceback(tmp_path, tiny_suite_path, monkeypatch):
    real = shards_module.play

    async def play(config, factories, jobs, pool=None):
        if config.out.name == "2-of-2":
            raise RuntimeError("CUDA out of memory while loading the seller")
        return await real(config, factories, jobs, pool=pool)

    monkeypatch.setattr(shards_module, "play", play)
    out = tmp_path / "run"
    config_file = tmp_path / "launcher.toml"
    config_file.write_text('[launcher]\nkind = "submitit-debug"\ntimeout_min = 5\n')
    failed = _eval(out, tiny_suite_path, "--shards", "2", "--launcher-config", str(config_file))
    assert failed.exit_code == 1, failed.output
    flat = " ".join(failed.output.split())
    assert "1 of 2 shards did not play all their negotiations" in flat and "Traceback" not in failed.output
    record = JobRecord.read(Shard(1, 2).directory(out))
    error_log = Shard(1, 2).directory(out) / "error.log"
    assert (
        f"shard 2-of-2: failed: RuntimeError: CUDA out of memory while loading the seller (traceback: {error_log})"
        in flat
    )
    assert f"(log: {record.stderr})" in flat and "Traceback" in error_log.read_text()
    monkeypatch.setattr(shards_module, "play", real)
    res = _eval(out, tiny_suite_path, "--shards", "2", "--launcher-config", str(config_file))
    assert res.exit_code == 0, res.output
    assert "shard 1-of-2: finished before" in res.output and "failed before (RuntimeError: CUDA" in res.output
    assert not error_log.exists()


def test_a_shard_an_earlier_job_still_holds_is_waited_for(tmp_path, tiny_suite_path, monkeypatch):
    monkeypatch.setattr(shards_module, "POLL_S", 0.02)
    config = _config(tmp_path / "run", tiny_suite_path)
    held, release = threading.Event(), threading.Event()

    def earlier_job() -> None:
        with exclusive_run(Shard(0, 2).directory(config.out), "an earlier shard job"):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=earlier_job)
    thread.start()
    held.wait(10)
    lines: list[str] = []

    def echo(line: str) -> None:
        lines.append(line)
        release.set()

    try:
        result = evaluate_sharded(config, ShardConfig(2, LauncherConfig("submitit-debug")), resolve, echo=echo)
    finally:
        release.set()
        thread.join()
    assert lines[0].startswith("shard 1-of-2: held by an earlier shard job") and "waiting for it" in lines[0]
    assert result.metrics.height == 144 and "submitted 2 shard(s)" in lines[1]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--shards", "0", "--launcher", "submitit-debug"], "--shards must be an integer >= 1, got 0"),
        (["--shards", "2", "--launcher", "local"], "--shards needs a launcher that submits jobs"),
        (["--shards", "2"], "--shards needs a launcher that submits jobs"),
        (["--launcher", "submitit-debug"], "--launcher and --launcher-config go with --shards K"),
        (["--shards", "2", "--launcher", "pbs"], "launcher kind must be one of"),
        (["--shards", "49", "--launcher", "submitit-debug"], "--shards 49 is more than the 48 negotiations"),
        (["--shards", "2", "--launcher-config", "missing.toml"], "missing.toml: cannot read launcher config"),
    ],
)
def test_bad_shard_arguments_are_refused_before_anything_is_written(tmp_path, tiny_suite_path, extra, message):
    out = tmp_path / "run"
    res = _eval(out, tiny_suite_path, *extra, baselines="none")
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()) and "Traceback" not in res.output
    assert not (out / "run.json").exists()


def test_a_bad_launcher_table_is_refused_naming_the_file_and_the_key(tmp_path, tiny_suite_path):
    path = tmp_path / "launcher.toml"
    for text, message in [
        ('[launcher]\nkind = "submitit-debug"\ngpus = 1\n', r"unknown key(s) in [launcher]: ['gpus']"),
        ("[launcher]\ntimeout_min = 0\n", "bad value in [launcher]: launcher timeout_min must be an integer >= 1"),
        ('[sweep.launcher]\nkind = "slurm"\n', "needs a [launcher] table"),
    ]:
        path.write_text(text)
        res = _eval(tmp_path / "run", tiny_suite_path, "--shards", "2", "--launcher-config", str(path))
        assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output


def test_a_copy_killed_between_its_turns_and_its_negotiations_leaves_nothing_and_copies_once_again(
    tmp_path, tiny_suite_path, monkeypatch
):
    config = replace(_config(tmp_path / "source", tiny_suite_path), baselines=(), diagnostic=None)
    evaluate(config, resolve)
    source, target = config.out / "transcripts", tmp_path / "target"
    real = TranscriptWriter._write

    def write(writer, frame, table, name):
        real(writer, frame, table, name)
        if table == "turns":
            raise Interrupted

    monkeypatch.setattr(TranscriptWriter, "_write", write)
    with pytest.raises(Interrupted), TranscriptWriter(target) as writer:
        writer.copy_from(source)
    monkeypatch.setattr(TranscriptWriter, "_write", real)
    assert read_negotiations(target).is_empty() and read_turns(target).is_empty()
    for copied in (32, 0):  # the orphaned turns part is repaired away on opening; a second copy adds nothing
        with TranscriptWriter(target) as writer:
            assert writer.copy_from(source) == copied
        for read in (read_negotiations, read_turns):
            assert read(target).equals(read(source))


def test_eval_help_names_the_shard_options():
    res = CliRunner().invoke(_app(), ["eval", "--help"], terminal_width=200)
    assert res.exit_code == 0 and all(f in res.output for f in ("--shards", "--launcher", "--launcher-config"))
