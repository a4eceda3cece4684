"""A tiny model trained for a few GRPO steps through the real market hook (slow-ish: one shared run)."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from nego.agents.compact.protocol import OPP, CompactFactory, CompactPolicy, make_factory, offer_levels
from nego.agents.model_registry import lookup
from nego.agents.registry import resolve
from nego.market.marketplace import Job
from nego.market.protocol import run_negotiation
from nego.market.transcripts import read_negotiations
from nego.market.types import ActionKind
from nego.scenarios.scenario import Role
from nego.training import grpo
from nego.training.config import TrainConfig
from nego.training.rewards import outcome_reward
from nego.training.rollout import MarketRollout, split_scenarios, to_trl
from nego.training.runner import EpisodeRunner

pytestmark = pytest.mark.slow
HOOKS: list[dict] = []
ROLLOUTS: list[list] = []


class RecordingObserver:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.dev: list[int] = []

    def on_step(self, row):
        self.rows.append(dict(row))

    def on_dev(self, dev):
        self.dev.append(dev.step)


OBSERVER = RecordingObserver()


class RecordingRollout(MarketRollout):
    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        HOOKS.append(out)
        ROLLOUTS.append(list(self.last))
        return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("NEGO_HOME", str(home))
    mp.setattr(grpo, "MarketRollout", RecordingRollout)
    cfg = TrainConfig(
        out=str(home / "run"),
        train_scenarios=8,
        dev_scenarios=2,
        sft_episodes=64,
        sft_steps=40,
        sft_batch=16,
        sft_lr=3e-3,
        steps=2,
        group_size=4,
        scenarios_per_step=2,
        save_every=1,
        eval_every=0,
        max_rounds=4,
        threads=1,
        time_budget_min=0,
        lr=1e-3,
    )
    result = grpo.train(cfg, echo=lambda s: None, observer=OBSERVER)
    yield cfg, result
    mp.undo()


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_splits_alternate_openers_like_the_evaluation_suites():
    scenarios = split_scenarios("train", 6, 7)
    assert [s.opener for s in scenarios] == [Role.SELLER, Role.BUYER] * 3 and {s.max_rounds for s in scenarios} == {7}
    assert {s.opener for s in split_scenarios("dev", 4, 7, (Role.SELLER,))} == {Role.SELLER}
    with pytest.raises(ValueError, match="openers"):
        split_scenarios("dev", 2, 7, ())


def test_a_dev_evaluation_under_a_concurrency_cap_plays_every_negotiation_as_uncapped():
    from nego.training.evaluate import evaluate
    from nego.training.tiny_model import build_tiny_model
    from nego.training.tokenizer import build_tokenizer

    tok = build_tokenizer()
    policy = CompactPolicy(build_tiny_model(tok), tok)
    scenarios, buyers = split_scenarios("dev", 5, 5), ["tft", "hazard", "timedep:e=1"]
    results, caps = [], []
    for cap in (0, 4, 1):
        with EpisodeRunner({"learner": CompactFactory("learner", policy, 1.0)}) as runner:
            market_play, seen = runner.market.play, []

            async def play(jobs, market_play=market_play, seen=seen, runner=runner):
                seen.append(runner.market.concurrency)
                return await market_play(jobs)

            runner.market.play = play
            results.append(evaluate(runner, "learner", scenarios, buyers, seed=3, concurrency=cap))
            caps.append((seen, runner.market.concurrency))
    assert caps == [([1024], 1024), ([4], 1024), ([1], 1024)]  # capped for the evaluation only
    assert results[0] == results[1] == results[2]
    assert len({u for r in results[0].buyers for u in r.utility}) > 1


def test_mask_covers_exactly_the_sellers_tokens(widget_scenario):
    from nego.training.tiny_model import build_tiny_model
    from nego.training.tokenizer import build_tokenizer

    tok = build_tokenizer()
    policy = CompactPolicy(build_tiny_model(tok), tok)
    scenarios = [widget_scenario, *split_scenarios("dev", 3, 5)]  # the second dev scenario is opened by the buyer
    assert scenarios[2].opener is Role.BUYER
    jobs = [Job(sc, "learner", "timedep:e=1", seed) for sc, seed in zip(scenarios, [1, 2, 3, 4], strict=True)]
    with EpisodeRunner({"learner": CompactFactory("learner", policy, 1.0)}) as runner:
        episodes = runner.rollouts(jobs)
    hook = to_trl([r.sample for r in episodes], 1024)
    for i, ep in enumerate(episodes):
        ids, mask = hook["completion_ids"][i], hook["env_mask"][i]
        words = [policy.words[t] for t in ids]
        assert len(ids) == len(mask) == len(hook["logprobs"][i]) and words[-1] == "</s>" and mask[-1] == 0
        seller_said = [w for t in ep.result.turns if t.role is Role.SELLER for w in t.action.raw.split()]
        assert [w for w, m in zip(words, mask, strict=True) if m] == seller_said  # token by token, in order
        env = [w for w, m in zip(words, mask, strict=True) if not m]
        view = ep.job.scenario.view_for(Role.SELLER)
        last_seller = max(t.index for t in ep.result.turns if t.role is Role.SELLER)
        buyer_offers = [
            t.action.offer
            for t in ep.result.turns
            if t.role is Role.BUYER and t.valid and t.action.kind is ActionKind.OFFER and t.index < last_seller
        ]  # seen by the seller
        expected = [[OPP, *(f"L{k}" for k in offer_levels(view, o))] for o in buyer_offers]
        starts = [j for j, w in enumerate(env) if w == OPP]
        assert [env[j : j + len(view.issues) + 1] for j in starts] == expected
        assert all(lp == 0.0 for lp, m in zip(hook["logprobs"][i], mask, strict=True) if not m)


def test_rewards_reach_the_trainer_from_the_structured_outcome(run):
    cfg, result = run
    assert len(HOOKS) == len(ROLLOUTS) == cfg.steps
    log = pl.read_parquet(result.run_dir / "train_log.parquet").filter(pl.col("reward_mean").is_not_null())
    for hook, rollouts, logged in zip(HOOKS, ROLLOUTS, log["reward_mean"].to_list(), strict=True):
        assert len(hook["prompt_ids"]) == cfg.group_size * cfg.scenarios_per_step
        expected = []
        for r in rollouts:
            o = r.result.outcome
            reservation = r.job.scenario.seller.reservation
            expected.append(outcome_reward(o.seller_utility, o.agreed, reservation, o.invalid_seller, None, 0.1))
        assert hook["reward"] == pytest.approx(expected)
        assert logged == pytest.approx(np.mean(expected), abs=1e-5)
        specs, g = [r.job.buyer for r in rollouts], cfg.group_size
        assert all(len(set(specs[i : i + g])) == 1 for i in range(0, len(specs), g))  # one buyer per group
    assert {"deal_rate", "invalid_rate", "entropy", "identical_group_share", "tokens_per_s", "collapse"} <= set(
        log.columns
    )


def test_training_transcripts_hold_exactly_the_rollouts_the_trainer_scored(run):
    cfg, result = run
    rows = read_negotiations(result.run_dir / "transcripts").filter(pl.col("arm") == "train").sort("step", "group")
    played = [r for batch in ROLLOUTS for r in batch]
    assert rows.height == len(played) == cfg.steps * cfg.scenarios_per_step * cfg.group_size
    by_id = {r["negotiation_id"]: r for r in rows.iter_rows(named=True)}
    for r, reward in zip(played, [x for h in HOOKS for x in h["reward"]], strict=True):
        row = by_id[r.job.negotiation_id]
        assert (row["step"], row["group"], row["policy_version"]) == (r.job.step, r.job.group, r.job.step)
        assert row["reward"] == pytest.approx(reward) and row["seller_utility"] == r.result.outcome.seller_utility
        assert row["seller"] == "tiny-rl" and row["buyer"] == r.job.buyer and row["seed"] == r.job.seed
    assert sorted(set(rows["step"].to_list())) == list(range(cfg.steps))
    dev = read_negotiations(result.run_dir / "transcripts").filter(pl.col("arm") == "dev")
    assert sorted(set(dev["step"].to_list())) == [0, cfg.steps]  # the base and the final evaluation
    warm = read_negotiations(result.run_dir / "transcripts").filter(pl.col("arm") == "warm-start")
    assert warm.height == cfg.sft_episodes


def test_a_training_negotiation_replays_exactly_through_the_market(run):
    """The first step was played by the warm start (policy version 0), registered as `tiny`: its recorded job,
    handed to the marketplace that `nego simulate` uses, plays the same negotiation turn for turn."""
    _, result = run
    from nego.market.marketplace import run_jobs
    from nego.market.transcripts import read_turns

    first = ROLLOUTS[0]
    jobs = [replace(r.job, seller="tiny") for r in first]
    replayed = run_jobs(resolve, jobs)
    turns = read_turns(result.run_dir / "transcripts")
    for r, again in zip(first, replayed, strict=True):
        assert again.outcome == r.result.outcome
        recorded = turns.filter(pl.col("negotiation_id") == r.job.negotiation_id)
        assert [t.action.raw for t in again.turns] == recorded["raw"].to_list()


def test_parameters_change_and_models_are_registered(run):
    cfg, result = run
    base, final = _weights(result.run_dir / "base"), _weights(result.run_dir / "final")
    assert any(not (base[k] == final[k]).all() for k in base)
    entry = lookup("tiny-rl")
    assert entry is not None and entry.base == "tiny" and entry.steps == cfg.steps and "dev" in entry.eval
    factory = make_factory(entry)
    assert (factory.spec, factory.kind) == ("tiny-rl", "compact")
    # played as trained: sampled at the rollout temperature, the tiny default unless the run set one
    assert factory.temperature == cfg.sampling_temperature == 0.7 and entry.config["temperature"] == 0.7
    assert lookup("tiny").config["temperature"] == 0.7
    assert make_factory(entry, 0.0).temperature is None  # 0 = greedy
    with pytest.raises(ValueError, match="temperature"):
        make_factory(entry, -1.0)
    sc = split_scenarios("dev", 1, 4)[0]
    r = asyncio.run(run_negotiation(sc, factory(Role.SELLER, 0), resolve("tft")(Role.BUYER, 0)))
    assert r.outcome.turns >= 1
    assert lookup("4.5b-rl") is None
    assert resolve("tiny-rl").spec == "tiny-rl"  # what `--sellers tiny-rl` goes through


def test_an_observer_sees_every_logged_step_and_the_dev_evaluations(run):
    cfg, result = run
    assert [r["step"] for r in OBSERVER.rows] == [1, 2]
    logged = pl.read_parquet(result.run_dir / "train_log.parquet")  # eval_every = 0: step rows only
    assert [r["reward_mean"] for r in OBSERVER.rows] == logged["reward_mean"].to_list()
    assert OBSERVER.dev == [0, cfg.steps]  # the warm start's and the trained model's dev evaluations


def test_checkpoint_resumes_to_the_same_state(run, tmp_path):
    cfg, result = run
    copy = tmp_path / "resumed"
    shutil.copytree(result.run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "checkpoint-2")
    shutil.rmtree(copy / "final")
    resumed = grpo.train(replace(cfg, out="", resume=str(copy), name="tiny-resumed"), echo=lambda s: None)
    assert resumed.steps == cfg.steps
    a, b = _weights(result.run_dir / "final"), _weights(copy / "final")
    for k in a:
        assert np.allclose(a[k].numpy(), b[k].numpy(), atol=1e-6), k
    # the killed run's step-2 rollouts were dropped and played again: same ids, no duplicates, same rewards
    before = read_negotiations(result.run_dir / "transcripts").filter(pl.col("arm") == "train")
    after = read_negotiations(copy / "transcripts").filter(pl.col("arm") == "train")
    assert after["negotiation_id"].n_unique() == after.height == before.height
    key = ["negotiation_id", "reward", "seller_utility"]
    assert after.sort("negotiation_id").select(key).equals(before.sort("negotiation_id").select(key))


def test_a_run_cut_short_by_the_time_cap_says_so_in_its_output_and_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    cfg = TrainConfig(
        out=str(tmp_path / "run"),
        name="capped",
        train_scenarios=8,
        dev_scenarios=1,
        sft_episodes=32,
        sft_steps=2000,
        sft_batch=8,
        steps=50,
        group_size=2,
        scenarios_per_step=2,
        eval_every=0,
        save_every=0,
        max_rounds=3,
        threads=1,
        time_budget_min=0.02,  # 1.2 s: the warm start gets 0.4 s, GRPO stops after its first step
    )
    lines: list[str] = []
    result = grpo.train(cfg, echo=lines.append)
    assert result.stopped_early and result.steps < cfg.steps
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert any("warm start" in w for w in warnings) and any(f"of {cfg.steps} GRPO steps" in w for w in warnings)
    base, rl = lookup("capped"), lookup("capped-rl")
    assert "warm-start steps" in base.config["cut_short"] and f"/{cfg.steps} GRPO steps" in rl.config["cut_short"]
    assert rl.eval["stopped_early"] and (result.run_dir / "final" / "CUT_SHORT").is_file()
