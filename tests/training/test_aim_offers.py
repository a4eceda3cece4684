"""A tiny seller that offers by aim: its warm start records rule sellers' offers as aims, and a trained model plays
them through the market."""

from __future__ import annotations

import pytest
from nego.scenarios.scenario import Role

pytestmark = pytest.mark.slow


def test_a_warm_start_in_aims_records_every_offer_as_one_aim_and_plays_the_offer_it_names():
    import asyncio

    from nego.agents.compact.protocol import EOT, OPP, aim_offer
    from nego.agents.registry import resolve
    from nego.market.protocol import run_negotiation
    from nego.training.rollout import split_scenarios
    from nego.training.sft import RecordingSeller

    for scenario in split_scenarios("train", 6, 10, (Role.SELLER, Role.BUYER)):
        seller = RecordingSeller(resolve("timedep:e=0.2,step=0.05")(Role.SELLER, 0), aims=True)
        result = asyncio.run(run_negotiation(scenario, seller, resolve("tft")(Role.BUYER, 0), seed=0))
        words, view = seller.trace.words, scenario.view_for(Role.SELLER)
        turns = [words[j + 1 : j + 3] for j, w in enumerate(words) if w == "offer" and (j == 0 or words[j - 1] != OPP)]
        played = [t.action.offer for t in result.turns if t.role is Role.SELLER and t.action.offer is not None]
        assert turns and len(turns) == len(played)
        for (aim, end), offer in zip(turns, played, strict=True):
            assert aim[0] == "a" and words[words.index(aim) + 1] == EOT and end == EOT
            assert offer == aim_offer(view, int(aim[1:]))


def test_nego_train_with_aims_registers_a_seller_that_offers_by_aim(tmp_path, monkeypatch):
    import asyncio

    from nego.agents.compact.protocol import CompactNegotiator, aim_offer, make_factory
    from nego.agents.model_registry import lookup
    from nego.agents.registry import resolve
    from nego.market.protocol import run_negotiation
    from nego.training import grpo
    from nego.training.config import DEV_BUYERS, TrainConfig
    from nego.training.evaluate import evaluate
    from nego.training.rollout import split_scenarios
    from nego.training.runner import EpisodeRunner

    monkeypatch.setenv("NEGO_HOME", str(tmp_path / "home"))
    cfg = TrainConfig(
        out=str(tmp_path / "run"),
        name="aimy",
        offer_words="aim",
        train_scenarios=8,
        dev_scenarios=2,
        sft_episodes=64,
        sft_steps=30,
        sft_batch=16,
        steps=2,
        group_size=2,
        scenarios_per_step=2,
        save_every=0,
        eval_every=0,
        threads=1,
    )
    grpo.train(cfg, echo=lambda s: None)
    scenarios = split_scenarios("dev", 4, 10, (Role.SELLER, Role.BUYER))
    for name in ("aimy", "aimy-rl"):
        factory = make_factory(lookup(name))
        assert "a100" in factory.policy.ids  # its tokenizer holds the aim words
        with EpisodeRunner({name: factory}) as runner:
            res = evaluate(runner, name, scenarios, DEV_BUYERS[:2], seed=1)
        assert [len(r.utility) for r in res.buyers] == [4, 4]
    # the warm start's own offers are aims: the cloned model writes them, and the market plays the offer each names
    policy = make_factory(lookup("aimy")).policy
    offers = 0
    for scenario in scenarios:
        seller = CompactNegotiator(policy, Role.SELLER, seed=0, temperature=None)
        result = asyncio.run(run_negotiation(scenario, seller, resolve("tft")(Role.BUYER, 0), seed=0))
        view = scenario.view_for(Role.SELLER)
        for t in result.turns:
            if t.role is Role.SELLER and t.action.offer is not None:
                aim = t.action.raw.split()[1]
                assert aim[0] == "a" and t.action.offer == aim_offer(view, int(aim[1:]))
                offers += 1
    assert offers >= len(scenarios)
