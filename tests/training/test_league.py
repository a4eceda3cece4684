"""League buyers: the learning seller's earlier policy on the buyer side, refreshed on a fixed schedule."""

from __future__ import annotations

import asyncio
import copy
import functools
import shutil
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents.compact.protocol import make_factory
from nego.agents.model_registry import lookup
from nego.agents.registry import resolve
from nego.market.protocol import run_negotiation
from nego.market.transcripts import read_negotiations
from nego.market.types import EndReason
from nego.scenarios.scenario import Role
from nego.training import grpo
from nego.training.config import ConfigError, TrainConfig
from nego.training.league import League, league_every
from nego.training.pool import BuyerPool
from nego.training.tiny_model import build_tiny_model
from nego.training.tokenizer import build_tokenizer

from ..conftest import make_widget_scenario


def test_league_specs_parse_and_bad_ones_say_how_to_write_them():
    assert league_every("league:every=40") == 40 and league_every(" League: every = 3 ") == 3
    assert league_every("timedep:e=1") is None and league_every("tiny-rl") is None
    for bad in ("league", "league:every=0", "league:every=x", "league:n=3", "league:every=2,at=1"):
        with pytest.raises(ConfigError, match="league:every=N"):
            league_every(bad)


def test_config_refuses_league_pools_it_cannot_play():
    with pytest.raises(ConfigError, match="at least one other buyer"):
        TrainConfig(train_buyers=["league:every=10"]).validate()
    with pytest.raises(ConfigError, match="tiny model only"):
        TrainConfig(model="4.5b", train_buyers=["tft", "league:every=10"]).validate()
    with pytest.raises(ConfigError, match="league:every=N"):
        TrainConfig(train_buyers=["tft", "league:every=-1"]).validate()
    TrainConfig(train_buyers=["tft", "league:every=10", "league:every=10", "league:every=5"]).validate()


def test_the_warm_start_pool_leaves_league_entries_out():
    pool = BuyerPool(("tft", "league:every=10", "reciprocal:r=0.5..1.5", "league:every=10", "league:every=5"))
    assert pool.league == (10, 5)
    assert pool.rules().specs == ("tft", "reciprocal:r=0.5..1.5") and pool.rules().league == ()
    plain = BuyerPool(("tft",))
    assert plain.rules() is plain


@functools.cache
def _built(seed: int):
    tok = build_tokenizer()
    return build_tiny_model(tok, seed=seed), tok


def _policy(seed: int = 0):
    """A fresh copy of a tiny policy (built once per seed) and its tokenizer."""
    model, tok = _built(seed)
    return copy.deepcopy(model), tok


def _nudge(model, step: int) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * (step + 1))


def _same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@settings(max_examples=10, deadline=None)
@given(every=st.integers(1, 4), steps=st.integers(1, 9))
def test_a_snapshot_is_taken_exactly_at_each_multiple_of_every(tmp_path_factory, every, steps):
    directory = tmp_path_factory.mktemp("league")
    policy, tok = _policy()
    league = League(every, directory, tok)
    versions, taken = [], {}
    for step in range(steps):
        changed = league.refresh(policy, step)
        assert changed == (step % every == 0)
        if changed:
            taken[step] = {k: v.clone() for k, v in policy.state_dict().items()}
        versions.append(league.version)
        snap = league.model.state_dict()
        assert all(torch.equal(snap[k], taken[league.version][k]) for k in snap)  # the policy as it was then
        _nudge(policy, step)  # an optimizer step
    assert versions == [s // every * every for s in range(steps)]
    assert sorted(p.name for p in directory.iterdir()) == [f"step-{s:06d}" for s in range(0, steps, every)]


def test_a_resumed_league_plays_the_saved_snapshot_and_refuses_a_missing_one(tmp_path):
    policy, tok = _policy()
    first = League(4, tmp_path, tok)
    for step in range(6):
        first.refresh(policy, step)
        _nudge(policy, step)
    resumed = League(4, tmp_path, tok)
    assert resumed.refresh(policy, 6) and resumed.version == 4 and _same_weights(resumed.model, first.model)
    shutil.rmtree(tmp_path / "step-000004")
    with pytest.raises(RuntimeError, match="snapshot of step 4 is missing"):
        League(4, tmp_path, tok).refresh(policy, 7)


def test_a_league_snapshot_plays_the_buyer_side_deterministically(tmp_path):
    policy, tok = _policy(seed=3)
    league = League(2, tmp_path, tok)
    league.refresh(policy, 0)
    factory = league.factory(1.0)
    assert factory.spec == "league:every=2,at=0"
    scenario = make_widget_scenario(max_rounds=6)

    def play():
        seller = resolve("timedep:e=1")(Role.SELLER, 1)
        return asyncio.run(run_negotiation(scenario, seller, factory(Role.BUYER, 5), seed=5))

    first, again = play(), play()
    assert first.outcome.end_reason is not EndReason.ERROR
    assert any(t.role is Role.BUYER for t in first.turns)
    assert [t.action for t in first.turns] == [t.action for t in again.turns]


@pytest.mark.slow
def test_training_against_a_league_refreshes_it_on_schedule_and_resumes_onto_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    cfg = TrainConfig(
        out=str(tmp_path / "run"),
        name="leagued",
        train_scenarios=8,
        dev_scenarios=1,
        sft_episodes=48,
        sft_steps=20,
        sft_batch=16,
        steps=5,
        group_size=2,
        scenarios_per_step=4,
        save_every=1,
        eval_every=0,
        max_rounds=4,
        threads=1,
        lr=1e-3,
        train_buyers=["timedep:e=1", "league:every=2", "league:every=2", "league:every=2"],
    )
    result = grpo.train(cfg, echo=lambda s: None)
    league_dir = result.run_dir / "league" / "every-2"
    assert sorted(p.name for p in league_dir.iterdir()) == ["step-000000", "step-000002", "step-000004"]
    train = read_negotiations(result.run_dir / "transcripts").filter(pl.col("arm") == "train")
    leagued = train.filter(pl.col("buyer").str.starts_with("league:"))
    assert leagued.height > 0 and train.filter(pl.col("buyer") == "league:every=2").height == 0
    for row in leagued.iter_rows(named=True):  # each negotiation met the snapshot due at its step
        assert row["buyer"] == f"league:every=2,at={row['step'] // 2 * 2}"
    # the warm start and the snapshot taken at step 0 are one policy
    base = make_factory(lookup("leagued")).policy.model
    from transformers import AutoModelForCausalLM

    assert _same_weights(base, AutoModelForCausalLM.from_pretrained(league_dir / "step-000000"))

    copy = tmp_path / "resumed"  # killed after step 3: resumes between refreshes, onto the step-2 snapshot
    shutil.copytree(result.run_dir, copy)
    for later in ("checkpoint-4", "checkpoint-5"):
        shutil.rmtree(copy / "checkpoints" / later)
    shutil.rmtree(copy / "final")
    shutil.rmtree(copy / "league" / "every-2" / "step-000004")
    resumed = grpo.train(replace(cfg, out="", resume=str(copy), name="leagued-resumed"), echo=lambda s: None)
    assert resumed.steps == cfg.steps
    after = read_negotiations(copy / "transcripts").filter(pl.col("arm") == "train")
    key = ["negotiation_id", "buyer", "reward"]
    assert after.sort("negotiation_id").select(key).equals(train.sort("negotiation_id").select(key))
    a = AutoModelForCausalLM.from_pretrained(result.run_dir / "final")
    b = AutoModelForCausalLM.from_pretrained(copy / "final")
    assert all(
        np.allclose(x.numpy(), y.numpy(), atol=1e-6)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_a_registered_seller_resolves_and_plays_as_a_buyer_spec(tmp_path, monkeypatch):
    from nego.agents.model_registry import ModelEntry, register

    monkeypatch.setenv("NEGO_HOME", str(tmp_path))
    policy, tok = _policy(seed=1)
    policy.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    register(ModelEntry("buyer-bot", str(tmp_path / "m"), "", "compact", {"temperature": 1.0}, 0))
    buyer = resolve("buyer-bot")(Role.BUYER, 2)
    scenario = make_widget_scenario(max_rounds=4)
    result = asyncio.run(run_negotiation(scenario, resolve("boulware")(Role.SELLER, 2), buyer, seed=2))
    assert result.outcome.end_reason is not EndReason.ERROR
    assert any(t.role is Role.BUYER for t in result.turns)  # an untrained policy: its moves need not be valid
