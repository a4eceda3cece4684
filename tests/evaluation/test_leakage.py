"""Held-out means held out: an arm trained against a buyer family the evaluation holds out is named in the run,
the report and on the console; `nego train` warns when its pool takes in a default held-out family."""

from __future__ import annotations

import json

import pytest
from nego.agents.model_registry import ModelEntry, register
from nego.agents.registry import resolve
from nego.cli.train_cmd import _warn_if_training_on_held_out
from nego.evaluation.config import EvalConfig
from nego.evaluation.leakage import families, trained_against
from nego.evaluation.report import write_report
from nego.evaluation.runner import evaluate
from nego.training.config import TrainConfig


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))


def _register(name: str, pool: list[str]) -> None:
    register(ModelEntry(name, f"/m/{name}", "", "compact", {"train_buyers": pool}))


def test_families_resolve_aliases_and_ignore_parameters_and_models():
    assert families(["boulware", "timedep:e=0.3..3,patience=0.4..1", "walker:k=2", "openai:gpt-5-mini"]) == {
        "timedep",
        "walker",
    }


def test_only_registered_arms_whose_pool_shares_a_held_out_family_are_named():
    _register("leaky-rl", ["timedep:e=0.3..3", "walker:k=2,patience=0.5..0.9"])
    _register("clean-rl", ["timedep:e=0.3..3", "tft"])
    _register("alias-rl", ["boulware"])
    held_out = ["walker", "picky", "hardliner"]
    sellers = ["leaky-rl", "clean-rl", "boulware", "openai:gpt-5-mini", "unregistered-rl"]
    assert trained_against(sellers, held_out) == {"leaky-rl": ["walker"]}
    assert trained_against(["alias-rl"], ["linear"]) == {"alias-rl": ["timedep"]}  # same family under two names


def test_an_eval_records_and_reports_the_overlap(tmp_path, tiny_suite_path):
    _register("leaky-rl", ["walker"])
    config = EvalConfig(
        sellers=("boulware", "leaky-rl"), out=tmp_path / "run", suite=str(tiny_suite_path), resamples=1_000
    )
    result = evaluate(config, lambda spec: resolve("linear" if spec == "leaky-rl" else spec))
    assert result.trained_against_held_out == {"leaky-rl": ["walker"]}
    assert json.loads((config.out / "run.json").read_text())["trained_against_held_out"] == {"leaky-rl": ["walker"]}
    report = write_report(config.out).read_text()
    assert "**not held out:** leaky-rl was trained against buyer family walker" in report


def test_train_warns_when_its_pool_takes_in_the_diagnostic_buyer(capsys):
    _warn_if_training_on_held_out(TrainConfig())
    assert capsys.readouterr().err == ""
    _warn_if_training_on_held_out(TrainConfig(train_buyers=["timedep:e=1", "hardliner:accept=0.9"]))
    assert "training pool includes hardliner" in capsys.readouterr().err


@pytest.mark.parametrize("field", ["train_buyers", "sft_sellers"])
@pytest.mark.parametrize("spec", ["walker", "walker:k=2,patience=0.5..0.9", "picky:margin=0.2", " Picky "])
def test_a_training_pool_or_warm_start_can_never_take_in_a_held_out_family(field, spec):
    from nego.training.config import ConfigError

    with pytest.raises(ConfigError, match=f"{field}: .* held-out evaluation family '(walker|picky)'"):
        TrainConfig(**{field: ["timedep:e=1", spec]}).validate()
