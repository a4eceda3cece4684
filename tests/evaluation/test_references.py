"""Reference sellers beside the arms: their block equals an evaluation of them as arms, ``none`` removes it, the
"vs best rule seller" difference is the paired comparison with the best reference, a reference that is an arm is
played once, and a rerun resumes them."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import typer
from nego.agents.registry import resolve
from nego.cli.eval_cmd import eval_
from nego.evaluation.config import DEFAULT_BASELINES, EvalConfig
from nego.evaluation.report import write_report
from nego.evaluation.runner import SUITE_GROUP, evaluate
from nego.evaluation.stats import paired_comparison
from nego.market.transcripts import read_negotiations
from typer.testing import CliRunner

ARMS = ("walker", "timedep:e=0.2")
"""The second arm is ``boulware`` under its family's name: that reference is played as the arm."""
REFERENCES = ("timedep:e=0.2", "linear", "conceder", "tft", "hardliner", "random")
ROW_NUMBERS = ["n", "clusters", "errors", "score", "score_low", "score_high", "deal_rate", "optimality_gap"]


def config(out: Path, **kw) -> EvalConfig:
    return EvalConfig(sellers=ARMS, out=out, suite="eval-dev", resamples=1_000, concurrency=16, **kw)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("references") / "run"
    return out, evaluate(config(out), resolve)


def test_baselines_take_default_none_or_specs():
    assert config(Path("x")).baselines == DEFAULT_BASELINES
    assert config(Path("x"), baselines=("default",)).baselines == DEFAULT_BASELINES
    assert config(Path("x"), baselines=("none",)).baselines == ()
    assert config(Path("x"), baselines=("tft", "linear")).baselines == ("tft", "linear")
    with pytest.raises(ValueError, match="stands alone"):
        config(Path("x"), baselines=("none", "tft"))


def test_the_reference_block_equals_an_eval_of_the_references_as_arms(default_run, tmp_path):
    out, result = default_run
    assert result.references == REFERENCES
    assert json.loads((out / "run.json").read_text())["baselines"] == list(REFERENCES)
    alone = evaluate(
        EvalConfig(sellers=REFERENCES, out=tmp_path, suite="eval-dev", resamples=1_000, baselines=()), resolve
    )
    mine = result.comparisons.filter(pl.col("reference")).select("group", "arm", *ROW_NUMBERS)
    theirs = alone.comparisons.select("group", "arm", *ROW_NUMBERS[:-1])
    assert mine.drop("optimality_gap").sort("group", "arm").equals(theirs.sort("group", "arm"))
    by_buyer = alone.metrics.filter(~pl.col("error")).group_by("buyer", "arm").agg(pl.col("optimality_gap").mean())
    for r in mine.filter(pl.col("group") != SUITE_GROUP).iter_rows(named=True):
        gap = by_buyer.filter((pl.col("buyer") == r["group"]) & (pl.col("arm") == r["arm"]))["optimality_gap"]
        assert r["optimality_gap"] == pytest.approx(gap.item()) and r["optimality_gap"] >= 0
    assert mine.filter(pl.col("arm") == "timedep:e=0.2").height == 4  # the arm's own rows, marked as a reference
    refs = result.comparisons.filter(pl.col("kind") == "reference")
    assert refs["gain"].null_count() == refs.height and refs["p_holm"].null_count() == refs.height


def test_baselines_none_removes_the_block_and_leaves_the_arms_as_they_were(default_run, tmp_path):
    _, result = default_run
    bare = evaluate(config(tmp_path, baselines=("none",)), resolve)
    assert bare.references == () and "kind" not in bare.comparisons.columns
    assert set(read_negotiations(tmp_path / "transcripts")["seller"]) == set(ARMS)
    arms = result.comparisons.filter(pl.col("kind") == "arm").select(bare.comparisons.columns)
    assert arms.equals(bare.comparisons)
    assert result.metrics.filter(pl.col("arm").is_in(ARMS)).equals(bare.metrics)
    assert json.loads((tmp_path / "run.json").read_text())["baselines"] == []


def test_vs_best_rule_seller_is_the_paired_comparison_with_the_best_reference(default_run):
    _, result = default_run
    ok = result.metrics.filter(~pl.col("error"))
    for buyer in ("walker", "picky", "hardliner"):
        mine = ok.filter(pl.col("buyer") == buyer)
        means = {ref: mine.filter(pl.col("arm") == ref)["score"].mean() for ref in REFERENCES}
        best = max(REFERENCES, key=lambda ref: means[ref])  # the first listed on a tie, as max keeps it
        for arm in ARMS:
            pairs = mine.filter(pl.col("arm") == best).join(mine.filter(pl.col("arm") == arm), on="key").sort("key")
            expected = paired_comparison(pairs["score"], pairs["score_right"], pairs["scenario_id"], resamples=1_000)
            row = result.comparisons.filter((pl.col("group") == buyer) & (pl.col("arm") == arm)).row(0, named=True)
            assert row["best_rule"] == best and row["vs_best_pairs"] == pairs.height
            assert (row["vs_best"], row["vs_best_low"], row["vs_best_high"]) == (
                expected.gain.mean,
                expected.gain.low,
                expected.gain.high,
            )
    suite_rows = result.comparisons.filter(pl.col("group") == SUITE_GROUP)
    assert suite_rows["vs_best"].null_count() == suite_rows.height  # per buyer only


def test_a_reference_that_is_an_arm_is_played_once_and_a_rerun_resumes(default_run):
    out, result = default_run
    rows = read_negotiations(out / "transcripts")
    assert set(rows["seller"]) == {*ARMS, *REFERENCES} and "boulware" not in set(rows["seller"])
    per_seller = 96 + 48  # the suite slots and the diagnostic negotiations
    assert rows.height == rows["negotiation_id"].n_unique() == per_seller * len({*ARMS, *REFERENCES})
    assert result.comparisons.group_by("group", "arm").len()["len"].max() == 1
    again = evaluate(config(out), resolve)
    assert again.played == 0 and again.comparisons.equals(result.comparisons)
    assert read_negotiations(out / "transcripts").height == rows.height


def test_report_and_console_show_the_references(default_run, tmp_path, tiny_suite_path):
    out, _ = default_run
    text = write_report(out).read_text()
    assert "Reference sellers on the same negotiations" in text and "vs best rule seller" in text
    assert "| `timedep:e=0.2` (arm) |" in text and "| `tft` |" in text
    app = typer.Typer()
    app.command("eval")(eval_)
    args = ["--sellers", "boulware", "--suite", str(tiny_suite_path), "--out", str(tmp_path / "cli")]
    res = CliRunner().invoke(app, [*args, "--resamples", "1000", "--baselines", "tft,boulware"])
    assert res.exit_code == 0, res.output
    assert "tft (ref)" in res.output and "vs best rule seller" in res.output
    assert "boulware (ref)" not in res.output
