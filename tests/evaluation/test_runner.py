"""Evaluation end to end on a tiny suite: arms, resume after an interruption, the report, the CLI commands."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest
import typer
from nego.agents.registry import resolve
from nego.cli.eval_cmd import eval_, report
from nego.evaluation.config import EvalConfig
from nego.evaluation.report import PLOTS, concession_table, load_run, write_report
from nego.evaluation.runner import evaluate, plan
from nego.evaluation.suites import load_suite
from nego.market.transcripts import read_negotiations
from typer.testing import CliRunner

ARMS = ("boulware", "linear")


class Interrupted(BaseException):
    """Stands in for Ctrl-C: not an Exception, so nothing on the way catches it."""


class InterruptAfter:
    """A factory source that builds agents normally until ``limit`` buyers were built, then interrupts."""

    def __init__(self, limit: int) -> None:
        self.limit, self.built = limit, 0

    def __call__(self, spec: str):
        inner = resolve(spec)
        source = self

        class Counting:
            def __init__(self) -> None:
                self.spec, self.kind = inner.spec, inner.kind

            def __call__(self, role, seed):
                if role.value == "buyer":
                    source.built += 1
                    if source.built > source.limit:
                        raise Interrupted
                return inner(role, seed)

        return Counting()


def config(tmp_path, suite, **kw) -> EvalConfig:
    return EvalConfig(sellers=ARMS, out=tmp_path, suite=str(suite), resamples=1_000, concurrency=4, **kw)


def test_an_interrupted_eval_resumes_without_duplicate_rows(tmp_path, tiny_suite_path):
    cfg = config(tmp_path / "run", tiny_suite_path, baselines=())
    planned = plan(load_suite(str(tiny_suite_path)), ARMS, cfg.buyers, cfg.diagnostic)
    with pytest.raises(Interrupted):
        evaluate(cfg, InterruptAfter(20))
    first = read_negotiations(tmp_path / "run" / "transcripts")
    assert 0 < first.height < len(planned)
    result = evaluate(cfg, resolve)
    rows = read_negotiations(tmp_path / "run" / "transcripts")
    assert rows.height == len(planned) == rows["negotiation_id"].n_unique()
    assert result.played == len(planned) - first.height
    assert result.metrics.height == len(planned) == result.metrics["negotiation_id"].n_unique()
    fresh = evaluate(config(tmp_path / "fresh", tiny_suite_path, baselines=()), resolve)
    cols = ["arm", "key", "score", "deal", "optimality_gap"]
    assert result.metrics.select(cols).sort("arm", "key").equals(fresh.metrics.select(cols).sort("arm", "key"))


def test_eval_pairs_arms_per_buyer_and_reports_n(tmp_path, tiny_suite_path):
    result = evaluate(config(tmp_path, tiny_suite_path, baselines=()), resolve)
    c = result.comparisons
    assert c["group"].unique(maintain_order=True).to_list() == ["suite", "walker", "picky", "hardliner"]
    suite_rows = c.filter(pl.col("group") == "suite")
    assert suite_rows["n"].to_list() == [16, 16] and suite_rows["clusters"].to_list() == [4, 4]
    gain = suite_rows.filter(pl.col("arm") == "linear").row(0, named=True)
    m = result.metrics.filter(~pl.col("diagnostic"))
    by_arm = {a: m.filter(pl.col("arm") == a).sort("key")["score"] for a in ARMS}
    assert gain["gain"] == pytest.approx((by_arm["linear"] - by_arm["boulware"]).mean())
    assert gain["gain_low"] <= gain["gain"] <= gain["gain_high"] and 0 < gain["p_value"] <= 1
    assert result.metrics.filter(pl.col("diagnostic"))["buyer"].unique().to_list() == ["hardliner"]
    assert result.metrics["optimality_gap"].min() >= 0


def test_a_rerun_with_another_suite_in_the_same_directory_is_refused(tmp_path, tiny_suite_path):
    evaluate(config(tmp_path, tiny_suite_path, diagnostic=None), resolve)
    with pytest.raises(ValueError, match="choose another --out"):
        evaluate(EvalConfig(sellers=ARMS, out=tmp_path, suite="eval-dev"), resolve)


def test_an_eval_on_a_directory_in_use_is_refused_before_it_writes(tmp_path, tiny_suite_path):
    from nego.market.locks import DirectoryBusy, exclusive_run

    with exclusive_run(tmp_path, "nego eval --out there"), pytest.raises(DirectoryBusy, match="nego eval --out there"):
        evaluate(config(tmp_path, tiny_suite_path, diagnostic=None), resolve)
    assert not (tmp_path / "run.json").exists() and not (tmp_path / "transcripts").exists()


def test_a_rerun_that_plays_model_agents_otherwise_is_refused(tmp_path, tiny_suite_path):
    greedy = {"template": "negotiator-v2", "temperature": 0.0}
    evaluate(replace(config(tmp_path, tiny_suite_path, diagnostic=None), play=greedy), resolve)
    evaluate(replace(config(tmp_path, tiny_suite_path, diagnostic=None), play=greedy), resolve)  # resumes
    with pytest.raises(ValueError, match=r"played with .*'temperature': 0.0.*choose another --out"):
        evaluate(
            replace(config(tmp_path, tiny_suite_path, diagnostic=None), play={**greedy, "temperature": 1.0}), resolve
        )
    assert "model agents played with template `negotiator-v2`, temperature `0.0`" in write_report(tmp_path).read_text()


def test_report_renders_every_plot(tmp_path, tiny_suite_path):
    evaluate(config(tmp_path, tiny_suite_path), resolve)
    path = write_report(tmp_path)
    text = path.read_text()
    suite = load_suite(str(tiny_suite_path))
    assert suite.content_hash() in text and "n = 16 negotiations per arm over 4 scenarios" in text
    for name in PLOTS:
        assert f"]({name})" in text
        assert coloured_fraction(tmp_path / name) > 0.0005, f"{name} shows no data"
    run = load_run(tmp_path)
    assert set(concession_table(run)["arm"]) == set(ARMS)


def coloured_fraction(path) -> float:
    """Share of clearly coloured pixels: axes, text and grids are grey, data drawn in the C0, C1, ... colours."""
    from matplotlib.image import imread

    rgb = imread(path)[..., :3]
    return float(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.25).mean())


def test_an_empty_plot_reads_as_empty(tmp_path):
    from nego.evaluation.report import pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    ax.set_title("nothing")
    fig.savefig(tmp_path / "empty.png")
    plt.close(fig)
    assert coloured_fraction(tmp_path / "empty.png") == 0.0


def test_cli_eval_and_report(tmp_path, tiny_suite_path):
    app = typer.Typer()
    app.command("eval")(eval_)
    app.command("report")(report)
    runner = CliRunner()
    out = tmp_path / "cli"
    args = ["eval", "--sellers", "boulware,conceder", "--suite", str(tiny_suite_path), "--out", str(out)]
    res = runner.invoke(app, [*args, "--resamples", "1000", "--buyers", "tft,walker"])
    assert res.exit_code == 0, res.output
    assert load_suite(str(tiny_suite_path)).content_hash() in res.output and "gain vs base" in res.output
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "report.md").is_file()
    bad = runner.invoke(app, ["eval", "--sellers", "boulware", "--suite", "no-such-suite", "--out", str(out / "x")])
    assert bad.exit_code == 2 and "unknown suite" in bad.output
