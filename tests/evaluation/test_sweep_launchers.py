"""Sweep cells handed to submitit: in-process (DebugExecutor), as local subprocesses (LocalExecutor) and to SLURM
through fake sbatch/sacct commands; the study is the one the sequential runner writes, a failed cell is reported
with its log while the others are kept, and a rerun collects jobs left running."""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.evaluation.config import LAUNCHER_KINDS, LauncherConfig, SweepConfig, load_launcher_config
from nego.evaluation.launchers import JobRecord, executor_parameters, make_executor, still_active
from nego.evaluation.sweep import Cell, SweepIncomplete, run_sweep
from nego.evaluation.sweep_cell import ERROR_LOG, cell_directory

from .fake_training import (
    failing_at_3e4,
    gated_training,
    killed_at_3e4,
    rule_training,
    training_runs,
)

LOW, HIGH = Cell("tiny", 1e-5, 0), Cell("tiny", 3e-4, 0)


def _config(out: Path, suite: Path, kind: str, **launcher) -> SweepConfig:
    return SweepConfig(
        out=out,
        sizes=("tiny",),
        learning_rates=(LOW.lr, HIGH.lr),
        suite=str(suite),
        diagnostic=None,
        resamples=1_000,
        train_args=launcher.pop("train_args", {}),
        launcher=LauncherConfig(kind=kind, timeout_min=5, **launcher),
    )


def _wait_until_ended(records: list[JobRecord]) -> None:
    for _ in range(1200):
        if not any(still_active(records)):
            return
        time.sleep(0.1)
    pytest.fail(f"local jobs {[r.job_id for r in records]} did not end")


def test_every_launcher_writes_the_study_the_local_runner_writes(tmp_path, tiny_suite_path, submitit_jobs):
    studies = {}
    for kind in ("local", "submitit-debug", "submitit-local"):
        cfg = _config(tmp_path / kind, tiny_suite_path, kind)
        studies[kind] = run_sweep(cfg, train_fn=rule_training, echo=lambda _: None)
        assert training_runs(cfg.out) == {LOW.name: 1, HIGH.name: 1}
        assert pl.read_parquet(cfg.out / "study.parquet").equals(pl.read_parquet(tmp_path / "local" / "study.parquet"))
        assert (cfg.out / "study.md").read_text() == (tmp_path / "local" / "study.md").read_text()
    assert studies["submitit-local"].filter(pl.col("group") == "suite")["lr"].to_list() == [LOW.lr, HIGH.lr]
    record = JobRecord.read(cell_directory(cfg, HIGH))
    assert record.kind == "submitit-local" and f"{HIGH.name}: evaluated" in Path(record.stdout).read_text()
    lines: list[str] = []
    again = run_sweep(cfg, train_fn=rule_training, echo=lines.append)
    assert again.equals(studies["submitit-local"])
    assert lines == [f"{LOW.name}: finished before", f"{HIGH.name}: finished before"]  # nothing submitted again


def test_a_failed_cell_is_reported_with_its_log_and_the_others_are_kept(tmp_path, tiny_suite_path, submitit_jobs):
    cfg = _config(tmp_path, tiny_suite_path, "submitit-debug")
    with pytest.raises(SweepIncomplete) as info:
        run_sweep(cfg, train_fn=failing_at_3e4, echo=lambda _: None)
    e = info.value
    assert (e.finished, e.total, e.active) == (1, 2, ())
    [failure] = e.failed
    error_log = cell_directory(cfg, HIGH) / ERROR_LOG
    assert failure.cell == HIGH.name and "RuntimeError: CUDA out of memory" in failure.detail
    assert str(error_log) in failure.detail and "Traceback" in error_log.read_text()
    assert failure.log == JobRecord.read(cell_directory(cfg, HIGH)).stderr and Path(failure.log).is_file()
    assert failure.line() in str(e) and "Rerun the sweep" in str(e)
    assert not (cfg.out / "study.parquet").exists()
    lines: list[str] = []
    study = run_sweep(cfg, train_fn=rule_training, echo=lines.append)
    assert training_runs(cfg.out) == {LOW.name: 1, HIGH.name: 1}  # the finished cell was kept, not run again
    assert f"{LOW.name}: finished before" in lines and any("failed before" in line for line in lines)
    assert study.filter(pl.col("group") == "suite").height == 2 and not error_log.exists()


def test_the_local_runner_stops_at_a_failed_cell_and_a_rerun_runs_only_the_rest(tmp_path, tiny_suite_path):
    cfg = _config(tmp_path, tiny_suite_path, "local")
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        run_sweep(cfg, train_fn=failing_at_3e4, echo=lines.append)
    error_log = cell_directory(cfg, HIGH) / ERROR_LOG
    assert "Traceback" in error_log.read_text() and lines[-1] == f"{HIGH.name}: failed (traceback: {error_log})"
    run_sweep(cfg, train_fn=rule_training, echo=lambda _: None)
    assert training_runs(cfg.out) == {LOW.name: 1, HIGH.name: 1}


def test_a_killed_cell_job_is_reported_with_its_job_log(tmp_path, tiny_suite_path, submitit_jobs):
    cfg = _config(tmp_path, tiny_suite_path, "submitit-local")
    with pytest.raises(SweepIncomplete) as info:
        run_sweep(cfg, train_fn=killed_at_3e4, echo=lambda _: None)
    [failure] = info.value.failed
    assert failure.cell == HIGH.name and "ended without finishing the cell" in failure.detail
    assert "about to be killed" in failure.detail  # the last line of the job's log
    assert failure.log == JobRecord.read(cell_directory(cfg, HIGH)).stderr and Path(failure.log).is_file()
    assert info.value.finished == 1 and (cell_directory(cfg, LOW) / "rows.parquet").is_file()


def test_no_wait_leaves_the_jobs_running_and_a_rerun_collects_them(tmp_path, tiny_suite_path, submitit_jobs):
    gate = tmp_path / "gate"
    cfg = _config(tmp_path / "study", tiny_suite_path, "submitit-local", train_args={"gate": str(gate)})
    try:
        with pytest.raises(SweepIncomplete) as first:
            run_sweep(cfg, train_fn=gated_training, echo=lambda _: None, wait=False)
        assert first.value.failed == () and [r.cell for r in first.value.active] == [LOW.name, HIGH.name]
        assert "Rerun the sweep once those jobs have ended" in str(first.value)
        records = [JobRecord.read(cell_directory(cfg, cell)) for cell in (LOW, HIGH)]
        with pytest.raises(SweepIncomplete) as second:  # the jobs wait at the gate: nothing is submitted again
            run_sweep(cfg, train_fn=gated_training, echo=lambda _: None, wait=False)
        assert len(second.value.active) == 2
        assert [JobRecord.read(cell_directory(cfg, cell)) for cell in (LOW, HIGH)] == records
    finally:
        gate.touch()
    _wait_until_ended(records)
    study = run_sweep(cfg, train_fn=gated_training, echo=lambda _: None, wait=False)
    assert training_runs(cfg.out) == {LOW.name: 1, HIGH.name: 1}
    assert study.filter(pl.col("group") == "suite")["lr"].to_list() == [LOW.lr, HIGH.lr]


def _fake_slurm(bin_dir: Path) -> None:
    scripts = {
        "srun": "exit 0",
        "sbatch": 'cp "$1" "$FAKE_SLURM/submitted-$$.sh"\necho "Submitted batch job $$"',
        "sacct": 'echo "JobID|State|NodeList"\ncat "$FAKE_SLURM/sacct.txt" 2>/dev/null\nexit 0',
    }
    bin_dir.mkdir(parents=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run_on_the_cluster(record: JobRecord) -> None:
    """What a SLURM node does with a cell job: load its submitted pickle and call it."""
    from submitit.core.utils import DelayedSubmission

    assert DelayedSubmission.load(Path(record.folder) / f"{record.job_id}_submitted.pkl").result() == "finished"


def test_slurm_cells_go_out_as_one_job_array_and_only_unfinished_cells_are_resubmitted(
    tmp_path, tiny_suite_path, submitit_jobs, monkeypatch
):
    slurm = tmp_path / "slurm"
    _fake_slurm(slurm / "bin")
    monkeypatch.setenv("FAKE_SLURM", str(slurm))
    monkeypatch.setenv("PATH", f"{slurm / 'bin'}{os.pathsep}{os.environ['PATH']}")
    cfg = _config(
        tmp_path / "study",
        tiny_suite_path,
        "slurm",
        partition="gpu",
        gpus_per_node=1,
        cpus_per_task=4,
        mem_gb=16,
        slurm_array_parallelism=1,
        slurm_additional_parameters={"account": "proj"},
        setup=("source env.sh",),
    )
    with pytest.raises(SweepIncomplete) as first:
        run_sweep(cfg, train_fn=rule_training, echo=lambda _: None, wait=False)
    assert len(first.value.active) == 2
    [script] = slurm.glob("submitted-*.sh")
    text = script.read_text()
    for flag in ("--partition=gpu", "--gpus-per-node=1", "--cpus-per-task=4", "--mem=16GB", "--time=5"):
        assert f"#SBATCH {flag}\n" in text
    assert "#SBATCH --array=0-1%1\n" in text and "#SBATCH --account=proj\n" in text and "\nsource env.sh\n" in text
    low, high = (JobRecord.read(cell_directory(cfg, cell)) for cell in (LOW, HIGH))
    array_id = low.job_id.split("_")[0]
    assert (low.job_id, high.job_id) == (f"{array_id}_0", f"{array_id}_1")

    (slurm / "sacct.txt").write_text(f"{low.job_id}|RUNNING|node1\n{high.job_id}|PENDING|\n")
    with pytest.raises(SweepIncomplete) as queued:
        run_sweep(cfg, train_fn=rule_training, echo=lambda _: None, wait=False)
    assert [r.detail for r in queued.value.active] == [f"slurm job {r.job_id} queued or running" for r in (low, high)]
    assert len(list(slurm.glob("submitted-*.sh"))) == 1

    _run_on_the_cluster(low)
    (slurm / "sacct.txt").write_text(f"{low.job_id}|COMPLETED|node1\n{high.job_id}|FAILED|node2\n")
    with pytest.raises(SweepIncomplete) as resubmitted:
        run_sweep(cfg, train_fn=rule_training, echo=lambda _: None, wait=False)
    assert (resubmitted.value.finished, [r.cell for r in resubmitted.value.active]) == (1, [HIGH.name])
    assert len(list(slurm.glob("submitted-*.sh"))) == 2
    again = JobRecord.read(cell_directory(cfg, HIGH))
    assert "_" not in again.job_id  # a single job this time, not an array

    _run_on_the_cluster(again)
    (slurm / "sacct.txt").write_text(f"{again.job_id}|COMPLETED|node3\n")
    study = run_sweep(cfg, train_fn=rule_training, echo=lambda _: None)
    assert training_runs(cfg.out) == {LOW.name: 1, HIGH.name: 1}
    assert study.filter(pl.col("group") == "suite").height == 2 and (cfg.out / "study.md").is_file()


@pytest.mark.parametrize("kind", ["local", "submitit-debug"])
def test_not_waiting_needs_a_launcher_whose_jobs_outlive_the_sweep(tmp_path, tiny_suite_path, kind):
    cfg = _config(tmp_path / "study", tiny_suite_path, kind)
    with pytest.raises(ValueError, match="outlive this process"):
        run_sweep(cfg, train_fn=rule_training, echo=lambda _: None, wait=False)
    assert not cfg.out.exists()


def test_submitit_is_imported_only_for_a_launcher_and_its_absence_names_the_extra(tmp_path, monkeypatch):
    code = "import sys, nego.evaluation.sweep, nego.cli.eval_cmd; print('submitit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(RuntimeError, match=r"pip install 'nego\[cluster\]'"):
        make_executor(LauncherConfig(kind="slurm"), tmp_path, "x")


def test_slurm_off_a_cluster_is_refused_with_what_to_do(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    with pytest.raises(RuntimeError, match="SLURM login node"):
        make_executor(LauncherConfig(kind="slurm"), tmp_path / "jobs", "x")


def test_the_launcher_table_of_a_sweep_file(tmp_path):
    from nego.evaluation.config import load_sweep_config

    path = tmp_path / "study.toml"
    path.write_text(
        '[sweep]\nsizes = ["tiny"]\n[sweep.launcher]\nkind = "slurm"\npartition = "gpu"\ngpus_per_node = 1\n'
        'folder = "logs"\nsetup = "module load cuda"\n[sweep.launcher.slurm_additional_parameters]\nqos = "high"\n'
    )
    assert load_sweep_config(path).launcher == LauncherConfig(
        kind="slurm",
        partition="gpu",
        gpus_per_node=1,
        folder=tmp_path / "logs",
        setup=("module load cuda",),
        slurm_additional_parameters={"qos": "high"},
    )
    path.write_text('[sweep]\nsizes = ["tiny"]\n')
    assert load_sweep_config(path).launcher == LauncherConfig()
    path.write_text('[sweep]\n[sweep.launcher]\nkind = "pbs"\n')
    with pytest.raises(ValueError, match=r"study.toml: bad value in \[sweep.launcher\]: launcher kind must be one"):
        load_sweep_config(path)
    path.write_text("[sweep]\n[sweep.launcher]\ngpus = 2\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) in \[sweep.launcher\]: \['gpus'\]"):
        load_sweep_config(path)


_VALID_TABLES = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(LAUNCHER_KINDS),
        "timeout_min": st.integers(1, 10_000),
        "gpus_per_node": st.integers(0, 8),
        "cpus_per_task": st.integers(1, 256),
        "mem_gb": st.floats(0.25, 4096),
        "partition": st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8),
        "slurm_array_parallelism": st.integers(1, 64),
        "setup": st.lists(st.text(max_size=12), max_size=3),
        "slurm_additional_parameters": st.dictionaries(st.sampled_from(["account", "qos"]), st.text(max_size=6)),
    },
)


@settings(max_examples=60, deadline=None)
@given(_VALID_TABLES)
def test_a_valid_launcher_table_loads_as_written_and_reaches_submitit(table):
    launcher = load_launcher_config(table, "s.toml", Path("/base"))
    for key, value in table.items():
        assert getattr(launcher, key) == (tuple(value) if key == "setup" else value)
    params = executor_parameters(launcher, "nego-sweep-x")
    assert params["timeout_min"] == launcher.timeout_min and params["name"] == "nego-sweep-x"
    slurm_only = {k for k in params if k.startswith("slurm_")}
    assert launcher.kind == "slurm" or not slurm_only
    if launcher.kind == "slurm" and launcher.partition:
        assert params["slurm_partition"] == launcher.partition


_NUMBER_KEYS = ["timeout_min", "gpus_per_node", "cpus_per_task", "slurm_array_parallelism", "mem_gb"]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(_NUMBER_KEYS),
    st.one_of(
        st.integers(max_value=-1),
        st.booleans(),
        st.text(max_size=3),
        st.floats(max_value=0.0),
        st.sampled_from([math.inf, math.nan]),
    ),
)
def test_a_bad_launcher_number_is_refused_naming_the_file_and_the_key(key, value):
    with pytest.raises(ValueError) as info:
        load_launcher_config({key: value}, "s.toml", Path("/base"))
    assert str(info.value).startswith("s.toml: bad value in [sweep.launcher]: launcher " + key)


def test_cli_sweep_hands_cells_to_a_launcher_and_says_what_is_left(tmp_path, tiny_suite_path, monkeypatch):
    pytest.importorskip("submitit")
    import typer
    from nego.cli.eval_cmd import sweep
    from nego.evaluation import sweep as sweep_module
    from typer.testing import CliRunner

    real, training = sweep_module.run_sweep, [failing_at_3e4]
    monkeypatch.setattr(sweep_module, "run_sweep", lambda cfg, **kw: real(cfg, **kw, train_fn=training[0]))
    app = typer.Typer()
    app.command("sweep")(sweep)
    app.command("noop")(lambda: None)
    path = tmp_path / "study.toml"
    path.write_text(
        f'[sweep]\nlearning_rates = [1e-5, 3e-4]\nsuite = "{tiny_suite_path}"\nresamples = 1000\ndiagnostic = ""\n'
    )
    failed = CliRunner().invoke(app, ["sweep", str(path), "--launcher", "submitit-debug"])
    assert failed.exit_code == 1, failed.output
    assert "submitted 2 cell(s) to submitit-debug" in failed.output and "1 of 2 cells finished" in failed.output
    assert f"failed: {HIGH.name}: RuntimeError: CUDA out of memory" in failed.output
    training[0] = rule_training
    res = CliRunner().invoke(app, ["sweep", str(path), "--launcher", "submitit-debug"])
    assert res.exit_code == 0, res.output
    assert "submitted 1 cell(s)" in res.output and (tmp_path / "study" / "study.md").is_file()
    bad = CliRunner().invoke(app, ["sweep", str(path), "--no-wait"])
    assert bad.exit_code == 2 and "outlive this process" in bad.output
    wrong = CliRunner().invoke(app, ["sweep", str(path), "--launcher", "pbs"])
    assert wrong.exit_code == 2 and "launcher kind must be one of" in wrong.output
    path.write_text('[sweep]\n[sweep.launcher]\nkind = "pbs"\n')
    bad_file = CliRunner().invoke(app, ["sweep", str(path)])
    assert bad_file.exit_code == 2 and "bad value in [sweep.launcher]" in bad_file.output
