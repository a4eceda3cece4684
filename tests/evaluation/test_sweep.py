"""The sweep: every cell trained once, evaluated on the same suite, and tabulated; reruns skip finished work."""

from __future__ import annotations

import dataclasses
import os

import polars as pl
import pytest
from nego.evaluation.config import SweepConfig, load_sweep_config
from nego.evaluation.sweep import Cell, TrainedArms, run_sweep

LRS = (1e-5, 1e-4, 3e-4)


class RuleTraining:
    """Stands in for training in the orchestration test: each learning rate "trains" a different rule seller."""

    def __init__(self) -> None:
        self.calls: list[Cell] = []

    def __call__(self, cell: Cell, directory, settings) -> TrainedArms:
        self.calls.append(cell)
        e = {1e-5: 0.2, 1e-4: 1.0, 3e-4: 2.0}[cell.lr]
        return TrainedArms("boulware", f"timedep:e={e}")


def test_sweep_trains_each_cell_once_and_tabulates_gains(tmp_path, tiny_suite_path):
    cfg = SweepConfig(out=tmp_path, sizes=("tiny",), learning_rates=LRS, suite=str(tiny_suite_path), resamples=1_000)
    train = RuleTraining()
    study = run_sweep(cfg, train_fn=train, echo=lambda _: None)
    assert len(train.calls) == 3
    assert study.filter(pl.col("group") == "suite").height == 3
    assert set(study["group"]) == {"suite", "walker", "picky", "hardliner"}
    lowest = study.filter((pl.col("group") == "suite") & (pl.col("lr") == 1e-5)).row(0, named=True)
    assert lowest["gain"] == 0.0  # the "trained" arm equals its base there
    for name in ("study.md", "gain_vs_size.png", "study.parquet"):
        assert (tmp_path / name).stat().st_size > 500
    again = run_sweep(cfg, train_fn=train, echo=lambda _: None)
    assert len(train.calls) == 3  # finished cells are not trained again
    assert again.select("lr", "group", "gain").equals(study.select("lr", "group", "gain"))
    changed = dataclasses.replace(cfg, train_args={"steps": 99})
    with pytest.raises(ValueError, match="trained with settings"):
        run_sweep(changed, train_fn=train, echo=lambda _: None)  # a stale cell is never reused silently
    assert len(train.calls) == 3


def test_a_second_sweep_on_a_study_in_use_is_refused_before_training(tmp_path, tiny_suite_path):
    from nego.market.locks import DirectoryBusy, exclusive_run

    cfg = SweepConfig(out=tmp_path, sizes=("tiny",), learning_rates=LRS, suite=str(tiny_suite_path), resamples=1_000)
    train = RuleTraining()
    with exclusive_run(tmp_path, "nego sweep (study X)"), pytest.raises(DirectoryBusy, match="study X"):
        run_sweep(cfg, train_fn=train, echo=lambda _: None)
    assert train.calls == []


def test_a_cell_trained_against_a_held_out_family_is_marked(tmp_path, tiny_suite_path, monkeypatch):
    from nego.agents.model_registry import ModelEntry, register
    from nego.agents.registry import resolve

    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))

    def leaky(cell, directory, settings):
        register(ModelEntry("leaky-rl", "/m/leaky", "", "compact", {"train_buyers": ["timedep:e=1", "walker"]}))
        return TrainedArms("boulware", "leaky-rl")

    cfg = SweepConfig(out=tmp_path / "s", sizes=("tiny",), learning_rates=(1e-4,), suite=str(tiny_suite_path))
    study = run_sweep(cfg, train_fn=leaky, factories=lambda s: resolve("linear" if s == "leaky-rl" else s), echo=print)
    assert set(study["trained_against"]) == {"walker"}
    assert "**not held out:** leaky-rl was trained against walker" in (cfg.out / "study.md").read_text()


def test_cell_names_keep_distinct_rates_apart():
    rates = (1e-5, 1.00000001e-5, 3e-6)
    assert len({Cell("tiny", lr, 0).name for lr in rates}) == 3


def test_sweep_config_from_toml(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(
        '[sweep]\nsizes = ["tiny"]\nlearning_rates = [1e-4]\nsuite = "eval-dev"\n[sweep.train]\nsteps = 3\n'
    )
    cfg = load_sweep_config(path)
    assert cfg.out == tmp_path / "sweep" and cfg.train_args == {"steps": 3} and cfg.learning_rates == (1e-4,)
    path.write_text("[sweep]\nsize = ['tiny']\n")
    with pytest.raises(ValueError, match="unknown key"):
        load_sweep_config(path)


@pytest.mark.slow
def test_sweep_with_real_tiny_training(tmp_path, tiny_suite_path, monkeypatch):
    pytest.importorskip("trl")
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    settings = {
        "steps": 2,
        "group_size": 2,
        "scenarios_per_step": 2,
        "train_scenarios": 8,
        "dev_scenarios": 2,
        "eval_every": 0,
        "save_every": 0,
        "sft_episodes": 40,
        "sft_steps": 3,
        "sft_batch": 8,
        "max_rounds": 4,
        "threads": 1,
    }
    cfg = SweepConfig(
        out=tmp_path / "sweep",
        sizes=("tiny",),
        learning_rates=LRS,
        suite=str(tiny_suite_path),
        diagnostic=None,
        train_args=settings,
        resamples=1_000,
    )
    study = run_sweep(cfg, echo=lambda _: None)
    suite_rows = study.filter(pl.col("group") == "suite")
    assert suite_rows["lr"].to_list() == list(LRS)
    assert all(t.endswith("-rl") for t in suite_rows["trained"])
    assert (tmp_path / "sweep" / "gain_vs_size.png").stat().st_size > 500
    assert os.path.isdir(tmp_path / "sweep" / "cells" / Cell("tiny", 1e-4, 0).name / "train")


def test_cli_sweep_runs_a_toml_and_refuses_a_bad_one(tmp_path, tiny_suite_path, monkeypatch):
    import typer
    from nego.cli.eval_cmd import sweep
    from nego.evaluation import sweep as sweep_module
    from typer.testing import CliRunner

    real = sweep_module.run_sweep
    monkeypatch.setattr(sweep_module, "run_sweep", lambda cfg, **kw: real(cfg, **kw, train_fn=RuleTraining()))
    app = typer.Typer()
    app.command("sweep")(sweep)
    app.command("noop")(lambda: None)  # two commands, so the name "sweep" is part of the command line
    path = tmp_path / "study.toml"
    path.write_text(f'[sweep]\nlearning_rates = [1e-5, 1e-4]\nsuite = "{tiny_suite_path}"\nresamples = 1000\n')
    res = CliRunner().invoke(app, ["sweep", str(path)])
    assert res.exit_code == 0, res.output
    assert "study.md" in res.output and (tmp_path / "study" / "study.md").is_file()
    assert "1e-05" in res.output and "0.0001" in res.output
    path.write_text("[sweep]\nlearning_rates = [-1.0]\n")
    bad = CliRunner().invoke(app, ["sweep", str(path)])
    assert bad.exit_code == 2 and "learning rates must be positive" in bad.output
