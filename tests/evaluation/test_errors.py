"""Negotiations that end in an error are neither no-deals nor pairs: they are left out of every mean and counted."""

from __future__ import annotations

import polars as pl
import pytest
from nego.agents.registry import resolve
from nego.evaluation.config import EvalConfig
from nego.evaluation.metrics import summarise
from nego.evaluation.runner import compare, evaluate
from nego.evaluation.suites import load_suite


class FailingOn:
    """Resolves specs normally, except that ``flaky`` is ``linear`` whose ``act`` raises on some scenarios."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing

    def __call__(self, spec: str):
        if spec != "flaky":
            return resolve(spec)
        inner, failing = resolve("linear"), self.failing

        class Flaky:
            def __init__(self, agent) -> None:
                self.agent = agent

            async def act(self, obs):
                if obs.scenario.id in failing:
                    raise RuntimeError("backend down")
                return await self.agent.act(obs)

        class Factory:
            spec, kind = "flaky", "fake"

            def __call__(self, role, seed):
                return Flaky(inner(role, seed))

        return Factory()


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_suite_path):
    suite = load_suite(str(tiny_suite_path))
    failing = {suite.scenarios[0].id}
    cfg = EvalConfig(
        sellers=("boulware", "flaky"),
        out=tmp_path_factory.mktemp("errors"),
        suite=str(tiny_suite_path),
        resamples=1_000,
        concurrency=4,
    )
    return evaluate(cfg, FailingOn(failing)), failing


def test_error_rows_have_null_outcome_metrics_but_keep_their_cost(run):
    result, failing = run
    m = result.metrics
    errors = m.filter(pl.col("error"))
    assert errors.height == 6  # 1 scenario x 2 openers x (2 suite buyers + the diagnostic buyer)
    assert set(errors["scenario_id"]) == failing and set(errors["arm"]) == {"flaky"}
    for col in ("score", "deal", "surplus_share", "nash", "ir_violation", "invalid_rate", "optimality_gap"):
        assert errors[col].null_count() == errors.height, col
    assert errors["tokens"].null_count() == 0


def test_errors_are_left_out_of_pairs_and_means_and_counted(run):
    result, failing = run
    c = result.comparisons.filter(pl.col("group") == "suite")
    flaky = c.filter(pl.col("arm") == "flaky").row(0, named=True)
    assert (flaky["n"], flaky["errors"], flaky["pairs"], flaky["clusters"]) == (12, 4, 12, 3)
    m = result.metrics.filter(~pl.col("diagnostic") & ~pl.col("error"))
    ok = m.filter(pl.col("arm") == "flaky")
    assert flaky["deal_rate"] == pytest.approx(ok["deal"].mean())
    base = m.filter((pl.col("arm") == "boulware") & ~pl.col("scenario_id").is_in(list(failing)))
    paired = ok.join(base.select("key", pl.col("score").alias("base")), on="key")
    assert flaky["gain"] == pytest.approx((paired["score"] - paired["base"]).mean())
    table = summarise(result.metrics.filter(~pl.col("diagnostic")))
    row = table.filter((pl.col("arm") == "flaky") & (pl.col("buyer") == "walker")).row(0, named=True)
    walker = ok.filter(pl.col("buyer") == "walker")
    assert (row["n"], row["errors"], row["scenarios"]) == (6, 2, 3)
    assert row["deal"] == pytest.approx(walker["deal"].mean()) and row["score"] == pytest.approx(walker["score"].mean())


def test_an_arm_without_pairs_gets_no_gain_instead_of_failing(run):
    result, _ = run
    m = result.metrics.with_columns(
        error=pl.when(pl.col("arm") == "boulware").then(True).otherwise(pl.col("error"))  # the base always failed
    )
    c = compare(m, ("boulware", "flaky"), resamples=1_000, seed=0).filter(pl.col("group") == "suite")
    assert c["arm"].to_list() == ["flaky"]
    row = c.row(0, named=True)
    assert row["pairs"] == 0 and row["gain"] is None and row["p_holm"] is None and row["n"] == 12
