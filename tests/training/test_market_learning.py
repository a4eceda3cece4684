"""A tiny seller learns with GRPO inside the market: a policy version per day, checkpoints, exact resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from nego.agents.model_registry import ModelEntry, register
from nego.market.transcript_rows import TIMING_COLUMNS
from nego.market.transcripts import read_negotiations
from nego.training.config import TrainConfig

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A NEGO_HOME with a quickly warm-started `tiny` registered."""
    import torch
    from nego.training.sanity import warm_start

    torch.set_num_threads(1)
    home = tmp_path_factory.mktemp("home")
    cfg = TrainConfig(sft_episodes=64, sft_steps=40, sft_batch=16, sft_lr=3e-3, train_scenarios=8, seed=0)
    model, tok, _ = warm_start(cfg)
    model.save_pretrained(home / "base")
    tok.save_pretrained(home / "base")
    mp = pytest.MonkeyPatch()
    mp.setenv("NEGO_HOME", str(home))
    register(ModelEntry("tiny", str(home / "base"), "", "compact", {"temperature": 1.0}, 40))
    yield home
    mp.undo()


def _run(directory: Path, days: int, kill_after_day: int | None = None) -> bool:
    """Run the market script; with ``kill_after_day``, SIGKILL it shortly after that day's learning. True if killed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "tests.training.market_run", str(directory), str(days)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if kill_after_day is not None and line.startswith(f"day {kill_after_day}: tiny-learning learned"):
                time.sleep(0.3)  # into the next day's negotiations
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
        assert proc.wait(timeout=600) == 0
        return False
    finally:
        if proc.poll() is None:
            proc.kill()


def _weights(path: Path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_simulate_learn_trains_a_policy_version_per_day_and_resumes_exactly_after_sigkill(home, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    learner = Path("learners") / "tiny-learning"
    assert not _run(whole, 3)
    state = json.loads((whole / learner / "state.json").read_text())
    assert (state["day"], state["version"], state["checkpoint"]) == (3, 3, "checkpoint-3")
    log = pl.read_parquet(whole / learner / "train_log.parquet")
    assert log["day"].to_list() == [1, 2, 3] and log["step"].to_list() == [1, 2, 3]  # step = update
    rows = read_negotiations(whole)
    mine = rows.filter(pl.col("seller") == "tiny-learning")
    assert sorted(set(mine["policy_version"].to_list())) == [0, 1, 2] and mine["reward"].is_not_null().all()

    assert _run(cut, 3, kill_after_day=2)
    assert not _run(cut, 3)
    a, b = read_negotiations(whole), read_negotiations(cut)
    drop = [c for c in TIMING_COLUMNS if c in a.columns]
    assert a.height == b.height and a.drop(drop).equals(b.drop(drop))
    wa, wb = (
        _weights(whole / learner / "checkpoints" / "checkpoint-3"),
        _weights(cut / learner / "checkpoints" / "checkpoint-3"),
    )
    assert all((wa[k] == wb[k]).all() for k in wa)


def test_nego_simulate_learn_trains_a_registered_model_and_registers_the_result(home, tmp_path):
    from nego.agents.model_registry import lookup
    from nego.cli.app import app
    from typer.testing import CliRunner

    out = tmp_path / "sim"
    args = ["simulate", "--learn", "tiny", "--days", "2", "--negotiations", "2", "--learn-sellers", "2"]
    args += ["--learn-group", "2", "--learn-batch", "2", "--threads", "1", "--out", str(out), "--no-live"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "registered tiny-learning-sim0" in res.output and "Learning seller per day" in res.output
    entry = lookup("tiny-learning-sim0")
    assert entry is not None and entry.format == "compact" and entry.steps == 2 and entry.base == "tiny"
    # the buyers it learned against are on record, for the held-out check of any evaluation of it
    met = entry.config["train_buyers"]
    assert met and set(met) <= {"boulware", "conceder", "tft", "reciprocal"}
    assert (out / "learners" / "tiny-learning" / "checkpoints" / "checkpoint-2").is_dir()
