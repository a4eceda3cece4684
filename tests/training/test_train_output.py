"""What ``nego train`` prints without a live view, and what a resumed run's log keeps."""

from __future__ import annotations

import polars as pl
import pytest
from nego.training import grpo
from nego.training.config import TrainConfig

pytestmark = pytest.mark.slow


def _cfg(out, **kw) -> TrainConfig:
    base = dict(
        out=str(out),
        train_scenarios=8,
        dev_scenarios=2,
        sft_episodes=32,
        sft_steps=4,
        sft_batch=8,
        steps=2,
        group_size=2,
        scenarios_per_step=2,
        save_every=1,
        eval_every=1,
        max_rounds=3,
        threads=1,
    )
    return TrainConfig(**{**base, **kw})


def test_plain_output_is_nego_lines_within_80_columns_and_a_resumed_log_keeps_every_step(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    grpo.train(_cfg(run), echo=print)
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert any(line.startswith("step 1: reward") for line in lines)
    assert any("dev evaluation" in line for line in lines)
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide
    assert not any("{'loss'" in line or "it/s" in line for line in lines)  # no raw metrics, no progress bars

    grpo.train(_cfg(run, steps=3, resume=str(run)), echo=lambda s: None)
    log = pl.read_parquet(run / "train_log.parquet")
    steps = log.filter(pl.col("dev_buyer").is_null())["step"].to_list()
    assert steps == [1, 2, 3]  # the resumed run logged step 3 beside the two it did not play again
    assert sorted(set(log.filter(pl.col("dev_buyer").is_not_null())["step"].to_list())) == [1, 2, 3]
