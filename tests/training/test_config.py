"""TrainConfig: impossible values and unknown fields fail before anything loads; the CLI reports them."""

from __future__ import annotations

import pytest
import typer
from nego.cli.train_cmd import build_config, train
from nego.training.config import ConfigError, TrainConfig, from_mapping, load_toml
from typer.testing import CliRunner


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"group_size": 1}, "group_size must be >= 2"),
        ({"lr": -1e-4}, "lr must be a non-negative"),
        ({"model": "gpt-2"}, "not one of tiny"),
        ({"loss_type": "ppo"}, "loss_type"),
        ({"no_deal_reward": "2"}, "no_deal_reward"),
        ({"train_buyers": ["timedep:e=0.5..x"]}, "train_buyers"),
        ({"bogus": 1}, "unknown field"),
        ({"steps": "ten"}, "steps must be int"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"sft_sellers": ["timedep:e=0.2,step=0.05;tft"]}, "sft_sellers: .*step must be a number"),
        ({"sft_sellers": ["tift"]}, "sft_sellers: unknown negotiator spec"),
        ({"offer_words": "words"}, "offer_words must be one of levels, aim"),
        ({"model": "smollm2", "offer_words": "aim"}, "offer_words: a chat model"),
    ],
)
def test_bad_values_are_rejected(override, message):
    with pytest.raises(ConfigError, match=message):
        from_mapping(override)


def test_defaults_toml_and_cli_fill_the_same_dataclass(tmp_path):
    cfg = TrainConfig().validate()
    assert cfg.learning_rate == 1e-4 and cfg.run_name == "tiny"
    assert from_mapping({"model": "4.5b"}).learning_rate == 1e-6
    path = tmp_path / "t.toml"
    path.write_text('[train]\ngroup_size = 4\nlr = 3e-5\ntrain_buyers = ["tft", "timedep:e=1..2"]\n')
    assert load_toml(path).group_size == 4
    cfg = build_config(path, {"steps": 7, "train_buyers": "tft,boulware"})
    assert (cfg.steps, cfg.lr, cfg.train_buyers) == (7, 3e-5, ["tft", "boulware"])
    cfg = build_config(None, {"train_buyers": "timedep:e=1..2,patience=0.5..1,tft, timedep:e=2,clock=negmas"})
    assert cfg.train_buyers == ["timedep:e=1..2,patience=0.5..1", "tft", "timedep:e=2,clock=negmas"]
    path.write_text("group_sise = 4\n")
    with pytest.raises(ConfigError, match="group_sise"):
        load_toml(path)


def test_shipped_tomls_load_and_the_tiny_one_is_the_default():
    from importlib import resources

    folder = resources.files("nego.training")
    assert load_toml(folder / "tiny.toml") == TrainConfig()
    gemma = load_toml(folder / "gemma.toml")
    assert gemma.model == "4.5b" and gemma.finetune == "lora" and gemma.learning_rate == 1e-6
    smollm2 = load_toml(folder / "smollm2.toml")
    assert smollm2.model == "smollm2" and smollm2.kind.name == "chat" and smollm2.sft_steps > 0


def test_cli_errors_are_clear_and_early():
    app = typer.Typer()
    app.command()(train)
    r = CliRunner().invoke(app, ["--group-size", "1"])
    assert r.exit_code == 2 and "group_size must be >= 2" in r.output
    r = CliRunner().invoke(app, ["--model", "4.5b", "--lr", "3e-6"])
    assert r.exit_code == 2 and "needs a CUDA GPU" in r.output  # before any download is attempted
    r = CliRunner().invoke(app, ["--model", "hf:/nonexistent/model"])
    assert r.exit_code == 2 and "/nonexistent/model: it does not exist" in r.output


def test_training_into_a_run_directory_in_use_is_refused_before_anything_loads(tmp_path):
    from nego.market.locks import DirectoryBusy, exclusive_run
    from nego.training import grpo

    with exclusive_run(tmp_path, "nego train --name tiny"), pytest.raises(DirectoryBusy, match="nego train --name"):
        grpo.train(TrainConfig(out=str(tmp_path)), echo=lambda s: None)
    assert not (tmp_path / "config.json").exists() and not (tmp_path / "base").exists()


def test_the_default_temperature_is_the_tiny_one_for_tiny_and_one_otherwise():
    assert TrainConfig().sampling_temperature == 0.7
    assert TrainConfig(model="4.5b").sampling_temperature == 1.0
    assert TrainConfig(temperature=1.3).sampling_temperature == 1.3
    assert TrainConfig(model="hf:/x", temperature=0.5).sampling_temperature == 0.5
