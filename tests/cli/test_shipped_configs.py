"""Every config file the project ships loads into its dataclass."""

from __future__ import annotations

from pathlib import Path

import pytest
from nego.evaluation.config import load_sweep_config
from nego.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["study-gemma4.toml", "study-tiny.toml", "study-tiny-t1.toml"])
def test_study_configs_load(name):
    cfg = load_sweep_config(ROOT / "configs" / name)
    assert cfg.sizes and cfg.learning_rates and cfg.out.name == name.removesuffix(".toml")


def test_the_study_config_is_the_published_grid():
    cfg = load_sweep_config(ROOT / "configs" / "study-gemma4.toml")
    assert cfg.sizes == ("2.3b", "4.5b", "12b", "31b")
    assert cfg.learning_rates == (1e-6, 3e-6, 1e-5)
    assert cfg.suite == "eval-1152"


def test_the_tiny_study_at_temperature_1_trains_at_1_and_the_default_one_at_the_default():
    t1 = load_sweep_config(ROOT / "configs" / "study-tiny-t1.toml")
    default = load_sweep_config(ROOT / "configs" / "study-tiny.toml")
    assert t1.train_args["temperature"] == 1.0 and "temperature" not in default.train_args
    assert TrainConfig(**t1.train_args).sampling_temperature == 1.0
    assert TrainConfig(**default.train_args).sampling_temperature == 0.7
