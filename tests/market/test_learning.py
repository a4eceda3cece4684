"""Learners in the market: the documented interface, groups of one prompt, rewards in the transcripts, resume."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest
from nego.agents.registry import resolve
from nego.market.learning import ROLLOUT_ARM, Learner, LearningGroup, LearnReport
from nego.market.population import BuyerSetup, MarketModel, SellerSetup
from nego.market.transcript_rows import TIMING_COLUMNS
from nego.market.transcripts import TranscriptWriter, read_negotiations
from nego.training.tuner import ARMS, ConcessionTuner


@dataclass
class CountingLearner:
    """The smallest learner there is: plays `linear`, keeps no record, counts what it is shown."""

    spec: str = "counter"
    group_size: int = 3
    calls: list[tuple[int, int]] = field(default_factory=list)
    groups: list[LearningGroup] = field(default_factory=list)
    version: int = 0

    @property
    def policy_version(self) -> int:
        return self.version

    def factory(self):
        inner = resolve("linear")

        @dataclass(frozen=True)
        class Factory:
            spec: str
            kind: str = "rule"

            def __call__(self, role, seed):
                return inner(role, seed)

        return Factory(self.spec)

    def score(self, job, result):
        return 1.0 + result.outcome.seller_utility

    def learn(self, day, groups):
        self.calls.append((day, len(groups)))
        self.groups.extend(groups)
        self.version += 1
        return LearnReport(self.version, 1, 0, {"groups": len(groups)})

    def resume(self):
        return 0

    def close(self):
        pass


BUYERS = [BuyerSetup("conceder", 40), BuyerSetup("tft", 40), BuyerSetup("hazard", 40)]


def market(learners, writer=None, days=3, seed=5) -> MarketModel:
    spec = learners[0].spec
    sellers = [SellerSetup(spec, 50), SellerSetup("boulware", 50), SellerSetup(spec, 50)]
    return MarketModel(resolve, sellers, BUYERS, days=days, seed=seed, writer=writer, learners=learners)


def test_a_learner_is_shown_each_day_its_pairs_as_groups_of_one_prompt(tmp_path):
    learner = CountingLearner()
    assert isinstance(learner, Learner)
    with TranscriptWriter(tmp_path) as writer, market([learner], writer) as m:
        days = m.run()
    assert [d for d, _ in learner.calls] == days["day"].to_list() == [1, 2, 3]
    for g in learner.groups:
        jobs = [p.job for p in g.episodes]
        assert len(jobs) == learner.group_size and len({(j.scenario, j.buyer) for j in jobs}) == 1
        assert len({j.seed for j in jobs}) == learner.group_size  # one situation, several seeds
        assert [j.arm for j in jobs] == ["", ROLLOUT_ARM, ROLLOUT_ARM] and {j.group for j in jobs} == {g.pair}
        assert all(p.reward == pytest.approx(1.0 + p.result.outcome.seller_utility) for p in g.episodes)
    rows = read_negotiations(tmp_path)
    mine = rows.filter(pl.col("seller") == "counter")
    assert mine.height == 3 * len(learner.groups) and mine["reward"].is_not_null().all()
    assert rows.filter(pl.col("seller") != "counter")["reward"].is_null().all()
    # the market settles one negotiation per pair: the day table counts pairs, not rollouts
    assert days["pairs"].sum() == rows.filter(pl.col("arm") != ROLLOUT_ARM).height
    versions = mine.group_by("day").agg(pl.col("policy_version").unique()).sort("day")["policy_version"].to_list()
    assert versions == [[0], [1], [2]]  # each day is played by the policy the previous day's learning produced
    per_seller = m.seller_days_frame()
    assert set(per_seller["seller"]) == {"counter", "boulware"}
    assert per_seller.filter(pl.col("seller") == "counter")["learning"].all()


def test_the_tuner_learns_between_days_and_a_rerun_continues_exactly(tmp_path):
    def run(directory: Path, days: int) -> ConcessionTuner:
        tuner = ConcessionTuner(directory / "tuner", group_size=2)
        with TranscriptWriter(directory / "t") as writer, market([tuner], writer, days=days, seed=9) as m:
            m.run()
        return tuner

    whole = run(tmp_path / "whole", 4)
    assert sum(whole.counts) > 0 and whole.version == 4 and len(whole.counts) == len(ARMS)
    run(tmp_path / "cut", 2)
    resumed = run(tmp_path / "cut", 4)  # the same command again, with more days: days 1-2 read back, 3-4 played
    assert (resumed.counts, resumed.totals, resumed.day) == (whole.counts, whole.totals, whole.day)
    a, b = read_negotiations(tmp_path / "whole" / "t"), read_negotiations(tmp_path / "cut" / "t")
    drop = [c for c in TIMING_COLUMNS if c in a.columns]
    assert a.height == b.height and a.drop(drop).equals(b.drop(drop))


def test_transcripts_of_days_after_the_last_learned_day_are_played_again(tmp_path):
    """A kill between a day's negotiations and its learning leaves transcripts the learner never learned from: they
    are dropped and that day is played again by the restored policy, ending where an uninterrupted run ends."""

    def run(directory: Path, days: int) -> ConcessionTuner:
        tuner = ConcessionTuner(directory / "tuner", group_size=2)
        with TranscriptWriter(directory / "t") as writer, market([tuner], writer, days=days, seed=4) as m:
            m.run()
        return tuner

    whole = run(tmp_path / "whole", 2)
    run(tmp_path / "cut", 1)
    day_one = (tmp_path / "cut" / "tuner" / "tuner.json").read_text()
    run(tmp_path / "cut", 2)
    (tmp_path / "cut" / "tuner" / "tuner.json").write_text(day_one)  # day 2 was played, its learning was lost
    again = run(tmp_path / "cut", 2)
    assert (again.counts, again.totals, again.version) == (whole.counts, whole.totals, whole.version)
    a, b = read_negotiations(tmp_path / "whole" / "t"), read_negotiations(tmp_path / "cut" / "t")
    drop = [c for c in TIMING_COLUMNS if c in a.columns]
    assert a.height == b.height and a.drop(drop).equals(b.drop(drop))


def test_learners_need_distinct_specs_and_positive_groups():
    with pytest.raises(ValueError, match="same spec"):
        market([CountingLearner(), CountingLearner()])
    with pytest.raises(ValueError, match="group_size"):
        market([CountingLearner(group_size=0)])


def test_the_market_and_the_tuner_import_no_training_library():
    import subprocess
    import sys

    code = (
        "import sys, pkgutil, importlib, nego.market as m\n"
        "for info in pkgutil.iter_modules(m.__path__): importlib.import_module(f'nego.market.{info.name}')\n"
        "import nego.training.tuner\n"
        "heavy = [x for x in ('torch', 'transformers', 'trl', 'datasets', 'peft') if x in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
