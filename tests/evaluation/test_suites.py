"""Frozen suites: shape, hash stability, tamper detection, and no overlap with the training stream."""

from __future__ import annotations

import itertools
import json
import logging

import pytest
from nego.evaluation import suites
from nego.evaluation.suites import (
    RECIPES,
    generate_suite,
    load_suite,
    problem_fingerprint,
    suite_from_dict,
    training_stream,
)
from nego.scenarios.analysis import analyse
from nego.scenarios.generator import generate_scenario


def test_eval_1152_has_the_promised_shape():
    suite = load_suite("eval-1152")
    assert len(suite.scenarios) == 96
    assert len(suite.slots()) == 1152
    assert len({s.category for s in suite.scenarios}) >= 12
    assert len({s.opener for s in suite.variants().values()}) == 2
    assert len({x.key for x in suite.slots()}) == 1152
    opposition = sorted(analyse(s).opposition for s in suite.scenarios)
    assert opposition[12] < 0.5 < opposition[-12]  # spread over the opposition range, not clumped
    assert all(s.zopa for s in suite.scenarios)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_regenerating_a_suite_from_its_seed_gives_the_stored_hash(name):
    stored = load_suite(name)
    regenerated = generate_suite(RECIPES[name]).content_hash()
    assert regenerated == stored.content_hash(), (
        "the scenario generator no longer reproduces the frozen suite: revert the generator change, or freeze a "
        "new suite version on purpose with nego.evaluation.suites.write_suite"
    )


def test_eval_dev_is_smaller_and_disjoint_from_eval_1152():
    dev, full = load_suite("eval-dev"), load_suite("eval-1152")
    assert len(dev.slots()) < len(full.slots())
    assert dev.recipe.seed != full.recipe.seed
    assert not {problem_fingerprint(s) for s in dev.scenarios} & {problem_fingerprint(s) for s in full.scenarios}


def test_an_edited_suite_file_is_refused(tmp_path):
    data = json.loads(suites.data_path("eval-dev").read_text())
    data["scenarios"][0]["seller"]["reservation"] = 0.123
    with pytest.raises(ValueError, match="does not match the content"):
        suite_from_dict(data, "edited.json")
    del data["recipe"]
    with pytest.raises(ValueError, match="not a valid suite file"):
        suite_from_dict(data, "broken.json")


def test_the_hash_changes_with_the_negotiation_list():
    dev = load_suite("eval-dev")
    fewer = suites.Suite(suites.SuiteRecipe("eval-dev", dev.recipe.seed, 24, seeds=(1,)), dev.scenarios)
    assert fewer.content_hash() != dev.content_hash()


def test_training_stream_never_yields_an_evaluation_scenario():
    eval_hashes = {v for name in RECIPES for v in load_suite(name).variants()}
    eval_problems = suites.evaluation_fingerprints()
    for seed in (0, 1, 12345):
        for s in itertools.islice(training_stream(seed), 200):
            assert s.content_hash() not in eval_hashes
            assert problem_fingerprint(s) not in eval_problems


def test_training_stream_refuses_evaluation_seeds():
    with pytest.raises(ValueError, match="reserved for evaluation"):
        next(training_stream(RECIPES["eval-1152"].seed))


def test_training_stream_drops_a_scenario_equal_to_an_evaluation_one(monkeypatch, caplog):
    planted = load_suite("eval-dev").scenarios[0]

    def generator(seed, *, index, max_rounds):
        return planted if index == 1 else generate_scenario(seed, index=index, max_rounds=max_rounds)

    monkeypatch.setattr(suites, "generate_scenario", generator)
    with caplog.at_level(logging.WARNING):
        got = list(itertools.islice(training_stream(7), 3))
    assert planted not in got and [s.id for s in got][1].endswith("-2")
    assert "an evaluation problem" in caplog.text


def test_the_training_splits_of_nego_train_hold_no_evaluation_scenario():
    rollout = pytest.importorskip("nego.training.rollout")
    assert not any(seed in suites.EVAL_SEED_RANGE for seed in rollout.SPLIT_SEEDS.values())
    eval_hashes = {v for name in RECIPES for v in load_suite(name).variants()}
    eval_problems = suites.evaluation_fingerprints()
    for split in ("train", "dev"):
        for s in rollout.split_scenarios(split, 1_000):
            assert s.content_hash() not in eval_hashes
            assert problem_fingerprint(s) not in eval_problems


def test_held_out_buyers_end_games_differ_from_the_training_pool():
    import asyncio

    from nego.agents.registry import resolve
    from nego.market.marketplace import Job, Marketplace

    config = pytest.importorskip("nego.training.config")
    pool = config.TrainConfig.__dataclass_fields__["train_buyers"].default_factory()
    families = {spec.split(":")[0] for spec in pool}
    assert not families & {b.split(":")[0] for b in (*suites.DEFAULT_BUYERS, suites.DIAGNOSTIC_BUYER)}
    scenarios = load_suite("eval-dev").scenarios[:12]
    buyers = ("timedep:e=0.5", "timedep:e=3", *suites.DEFAULT_BUYERS)  # both ends of the training pool's range
    jobs = [Job(s, seller, b, 0) for s in scenarios for seller in ("boulware", "hardliner:accept=0.9") for b in buyers]
    results = asyncio.run(Marketplace(resolve).run(jobs))
    walks, thin_deals = dict.fromkeys(buyers, 0), dict.fromkeys(buyers, 0)
    for job, r in zip(jobs, results, strict=True):
        walks[job.buyer] += r.outcome.end_reason.value == "walk_away"
        thin_deals[job.buyer] += r.outcome.agreed and r.outcome.buyer_utility < job.scenario.buyer.reservation + 0.15
    # training buyers hold out to the deadline and then settle for thin deals; walker leaves a stalled seller;
    # picky never settles for a barely rational deal
    assert walks["timedep:e=0.5"] == walks["timedep:e=3"] == 0 and walks["walker"] >= len(jobs) // len(buyers) // 2
    assert thin_deals["timedep:e=0.5"] > 0 and thin_deals["timedep:e=3"] > 0 and thin_deals["picky"] == 0


def test_a_suite_file_that_is_not_json_is_named_in_the_error(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(suites.data_path("eval-dev").read_text()[:200])  # a copy cut short
    with pytest.raises(ValueError, match=r"cut\.json: not a valid suite file \(not JSON"):
        load_suite(str(path))
