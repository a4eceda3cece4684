"""The GRPO wiring learns: a reward that is easy to learn rises through the real market rollout and trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nego.training.config import TrainConfig
from nego.training.sanity import SanityChecks, run_sanity, sanity_reward, warm_start

pytestmark = pytest.mark.slow


def test_first_offer_reward_rises_with_aligned_rows_and_matching_logprobs():
    torch.set_num_threads(1)
    cfg = TrainConfig(
        train_buyers=["timedep:e=3"],
        train_scenarios=2,
        scenarios_per_step=2,
        group_size=8,
        steps=25,
        max_rounds=2,
        sft_episodes=128,
        sft_steps=30,
        sft_sellers=["random"],  # openings of every utility: the reward differs within groups from the start
        sft_batch=16,
        sft_lr=3e-3,
        lr=1e-3,
        eval_every=0,
        save_every=0,
        time_budget_min=0,
        threads=1,
    ).validate()
    model, tok, _ = warm_start(cfg)
    run = run_sanity(cfg, model, tok, "first-offer")
    r = run.rewards
    assert len(r) == cfg.steps
    assert np.mean(r[-5:]) > np.mean(r[:5]) + 0.2, r
    assert sum(run.checks.misaligned) == 0
    assert max(run.checks.logprob_gap) < 1e-3  # the rollout's policy is the trained model, token for token


def test_sanity_reward_counts_rows_played_on_another_scenario():
    checks = SanityChecks()
    reward = sanity_reward("first-offer", checks, group=2, invalid_penalty=0.0)
    out = reward(["a", "a", "b", "b"], [""] * 4, scenario_id=["a", "b", "b", "a"], first_offer_u=[0.9, None, 0.5, 1.0])
    assert out == pytest.approx([0.1, 0.0, 0.5, 0.0])
    assert checks.misaligned == [2]
    with pytest.raises(ValueError, match="reward must be one of"):
        sanity_reward("nope", checks, 2, 0.0)
