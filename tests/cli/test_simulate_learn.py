"""`nego simulate --learn`: a learning seller in the market, its per-day table, and resume of market and learner."""

from __future__ import annotations

import json

import polars as pl
import pytest
from nego.cli.app import app
from nego.market.transcripts import read_negotiations
from typer.testing import CliRunner

runner = CliRunner()
ARGS = ["simulate", "--learn", "tuner", "--negotiations", "6", "--learn-sellers", "2", "--learn-group", "3"]


def test_a_learning_seller_trades_learns_daily_and_resumes_with_the_market(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, [*ARGS, "--days", "3", "--out", str(out), "--no-live"])
    assert res.exit_code == 0, res.output
    assert "Learning seller per day" in res.output and "tuner-learning learned" in res.output
    state = json.loads((out / "learners" / "tuner-learning" / "tuner.json").read_text())
    assert state["day"] == 3 and state["version"] == 3
    rows = read_negotiations(out)
    mine = rows.filter(pl.col("seller") == "tuner-learning")
    assert mine["reward"].is_not_null().all() and (mine.group_by("day", "pair").len()["len"] == 3).all()
    before = rows.height

    res = runner.invoke(app, [*ARGS, "--days", "4", "--out", str(out), "--no-live"])  # one more day: resumes
    assert res.exit_code == 0, res.output
    assert "day 4: tuner-learning learned" in res.output and "day 3: tuner-learning learned" not in res.output
    after = read_negotiations(out)
    assert after.filter(pl.col("day") <= 3).height == before  # nothing played twice
    assert json.loads((out / "learners" / "tuner-learning" / "tuner.json").read_text())["day"] == 4


def test_a_learner_that_is_not_registered_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    res = runner.invoke(app, ["simulate", "--learn", "nosuchmodel", "--out", str(tmp_path / "r"), "--no-live"])
    assert res.exit_code == 2 and "no model registered" in res.output
    assert not (tmp_path / "r" / "negotiations").exists() or not any((tmp_path / "r" / "negotiations").iterdir())


def test_a_learning_seller_never_trades_with_a_held_out_buyer_family():
    from nego.agents.registry import rule_family
    from nego.agents.rules.heldout import HELD_OUT_FAMILIES
    from nego.simulation import SimulateConfig

    default = SimulateConfig(learn="tuner").buyers
    assert "walker" in SimulateConfig().buyers and not {rule_family(b) for b in default} & set(HELD_OUT_FAMILIES)
    for spec in ("walker", "picky:margin=0.2"):
        with pytest.raises(ValueError, match="held-out evaluation family"):
            SimulateConfig(learn="tuner", buyers=("tft", spec))
