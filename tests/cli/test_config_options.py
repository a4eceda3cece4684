"""Options generated from config dataclasses: every field with help text is an option of its command, defaults
come from the dataclass, typed lists parse, and command-line values land in the same dataclass as TOML files."""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.cli.app import app
from nego.cli.config_options import config_options, given_values
from nego.evaluation.config import EvalConfig, SweepConfig
from nego.simulation import SimulateConfig
from nego.training.config import ConfigError, TrainConfig, load_toml
from typer.testing import CliRunner

runner = CliRunner()
WIDE = {"COLUMNS": "250"}


@pytest.mark.parametrize(
    ("command", "config"),
    [("simulate", SimulateConfig), ("eval", EvalConfig), ("sweep", SweepConfig), ("train", TrainConfig)],
)
def test_every_documented_field_is_an_option_of_its_command(command, config):
    res = runner.invoke(app, [command, "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    for option in config_options(config, optional=("out",)):
        assert option.flag.split("/")[0] in res.output, option.flag
        assert " ".join(option.help.split()[:4]) in " ".join(res.output.split()), option.name
    documented = {f.name for f in fields(config) if "help" in f.metadata and f.metadata.get("cli") is not False}
    assert documented == {o.name for o in config_options(config, optional=("out",))}


def test_simulate_and_eval_fill_their_dataclass_with_its_defaults(monkeypatch):
    seen = {}

    def capture(cfg, **_):
        seen["cfg"] = cfg
        raise ValueError("captured")

    monkeypatch.setattr("nego.cli.simulate_cmd.run_simulation", capture)
    res = runner.invoke(app, ["simulate"])
    assert res.exit_code == 2 and "captured" in res.output
    assert seen["cfg"] == SimulateConfig()

    monkeypatch.setattr("nego.evaluation.runner.evaluate", capture)
    res = runner.invoke(app, ["eval", "--sellers", "boulware,tft"])
    assert res.exit_code == 2 and "captured" in res.output
    cfg = seen["cfg"]
    defaults = EvalConfig(sellers=("boulware", "tft"), out=Path("runs/eval/eval-1152"), play=cfg.play)
    assert cfg == defaults and cfg.diagnostic == "hardliner" and cfg.optimality_gap


def test_eval_options_reach_the_config(monkeypatch):
    seen = {}

    def capture(cfg, **_):
        seen["cfg"] = cfg
        raise ValueError("captured")

    monkeypatch.setattr("nego.evaluation.runner.evaluate", capture)
    args = ["eval", "--sellers", "a,b", "--suite", "eval-dev", "--buyers", "tft,walker:k=4,delta=0.02"]
    args += ["--diagnostic", "none", "--no-gap", "--resamples", "2000", "--threads", "1", "--per-kind", "hf=2"]
    assert runner.invoke(app, args).exit_code == 2
    cfg = seen["cfg"]
    assert cfg.out == Path("runs/eval/eval-dev") and cfg.buyers == ("tft", "walker:k=4,delta=0.02")
    assert (cfg.diagnostic, cfg.optimality_gap, cfg.resamples, cfg.threads) == (None, False, 2000, 1)
    assert dict(cfg.per_kind) == {"hf": 2}


def test_sweep_options_override_the_toml_file(tmp_path, monkeypatch):
    seen = {}

    def capture(cfg, **_):
        seen["cfg"] = cfg
        raise ValueError("captured")

    monkeypatch.setattr("nego.evaluation.sweep.run_sweep", capture)
    path = tmp_path / "study.toml"
    path.write_text(
        '[sweep]\nsizes = ["tiny"]\nlearning_rates = [1e-5, 1e-4]\nsuite = "eval-dev"\n[sweep.train]\nsteps = 3\n'
    )
    res = runner.invoke(app, ["sweep", str(path)])
    assert res.exit_code == 2 and seen["cfg"].learning_rates == (1e-5, 1e-4) and seen["cfg"].out == tmp_path / "study"
    res = runner.invoke(app, ["sweep", str(path), "--learning-rates", "3e-4", "--seeds", "1,2", "--out", "elsewhere"])
    cfg = seen["cfg"]
    assert (cfg.learning_rates, cfg.seeds, cfg.out, cfg.sizes) == ((3e-4,), (1, 2), Path("elsewhere"), ("tiny",))
    assert cfg.train_args == {"steps": 3} and cfg.resamples == 10_000  # the dataclass default
    res = runner.invoke(app, ["sweep", str(path), "--learning-rates", "1e-4,fast"])
    assert res.exit_code == 2 and "--learning-rates" in res.output and "float" in res.output


FLOATS = st.floats(allow_nan=False, allow_infinity=False)
SPEC = st.from_regex(r"[a-z][a-z0-9.-]{0,8}(:[a-z]=[0-9.]{1,4}(,[a-z]=[0-9.]{1,4}){0,2})?", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(FLOATS, min_size=1, max_size=6), st.lists(st.integers(-(10**9), 10**9), min_size=1, max_size=6))
def test_number_lists_round_trip(floats, ints):
    options = config_options(SweepConfig, optional=("out",))
    text = {"learning_rates": ",".join(repr(x) for x in floats), "seeds": " , ".join(str(i) for i in ints)}
    assert given_values(options, text) == {"learning_rates": tuple(floats), "seeds": tuple(ints)}


@settings(max_examples=60, deadline=None)
@given(st.lists(SPEC, min_size=1, max_size=5))
def test_spec_lists_keep_each_specs_parameters(specs):
    options = config_options(SimulateConfig)
    assert given_values(options, {"buyers": ",".join(specs)}) == {"buyers": tuple(specs)}


def test_none_clears_an_optional_field_and_unset_options_are_left_out():
    options = config_options(EvalConfig, optional=("out",))
    assert given_values(options, {"diagnostic": "None", "seed": None}) == {"diagnostic": None}
    with pytest.raises(typer.BadParameter, match="int"):
        given_values(config_options(SweepConfig, optional=("out",)), {"seeds": "1,x"})


def test_train_writes_to_out_and_reads_the_old_output_dir_name_with_a_warning(tmp_path, caplog):
    from nego.cli.train_cmd import build_config
    from nego.training.checkpoints import load_run_config

    assert build_config(None, {"out": "runs/x"}).out == "runs/x"
    path = tmp_path / "t.toml"
    path.write_text('[train]\noutput_dir = "old/place"\nsteps = 5\n')
    with caplog.at_level(logging.WARNING):
        assert load_toml(path).out == "old/place"
    assert "output_dir is deprecated" in caplog.text and str(path) in caplog.text
    run = tmp_path / "run"
    run.mkdir()
    saved = {k: v for k, v in json.loads(json.dumps(TrainConfig().__dict__)).items() if k not in ("out", "resume")}
    (run / "config.json").write_text(json.dumps({**saved, "output_dir": str(run)}))
    resumed = load_run_config(run)
    assert resumed.out == str(run) and resumed.resume == str(run)
    path.write_text('[train]\noutput_dir = "a"\nout = "b"\n')
    with pytest.raises(ConfigError, match="output_dir is the old name of out"):
        load_toml(path)
    res = runner.invoke(app, ["train", "--output-dir", "x"])
    assert res.exit_code == 2 and "--output-dir" in res.output
