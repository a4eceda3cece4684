"""Exit status of commands that play negotiations: 1 with the reasons when nothing succeeded, 0 with a warning
count when only some failed."""

from __future__ import annotations

import polars as pl
import pytest
from nego.cli.app import app
from nego.cli.errors import error_messages
from nego.evaluation.suites import SuiteRecipe, generate_suite, write_suite
from typer.testing import CliRunner

runner = CliRunner()
UNREACHABLE = "remote:http://127.0.0.1:9"  # the discard port: every connection is refused


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_simulate_exits_1_and_says_why_when_every_negotiation_failed(tmp_path):
    args = ["simulate", "--sellers", UNREACHABLE, "--days", "1", "--negotiations", "3", "--no-live"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "run")], env={"COLUMNS": "200"})
    assert res.exit_code == 1, res.output
    out = _flat(res.output)
    assert "all 3 negotiations ended in an error" in out
    assert "3 x seller: RemoteAgentError: http://127.0.0.1:9 failed after 3 attempts" in out


def test_simulate_warns_with_a_count_when_some_failed(tmp_path):
    args = ["simulate", "--sellers", f"boulware,{UNREACHABLE}", "--days", "1", "--negotiations", "4", "--no-live"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "run")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "warning: 2 of 4 negotiations ended in an error" in _flat(res.output)


def test_eval_exits_1_when_no_negotiation_succeeded(tmp_path):
    recipe = SuiteRecipe("eval-two", seed=424_242, scenarios=2, seeds=(0,), max_rounds=4)
    suite = write_suite(generate_suite(recipe), tmp_path / "suite.json")
    args = ["eval", "--sellers", UNREACHABLE, "--suite", str(suite), "--diagnostic", "none", "--resamples", "1000"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "eval")], env={"COLUMNS": "200"})
    assert res.exit_code == 1, res.output
    assert "all 8 negotiations ended in an error; nothing succeeded" in _flat(res.output)


def test_error_messages_are_counted_most_frequent_first():
    frame = pl.DataFrame(
        {
            "end_reason": ["error", "agreement", "error", "error", "deadline", "error"],
            "error": ["b timeout", None, "a refused", "b timeout", None, None],
        }
    )
    assert error_messages(frame) == [("b timeout", 2), ("(no message)", 1), ("a refused", 1)]
    assert error_messages(frame.filter(pl.col("end_reason") != "error")) == []


@pytest.mark.parametrize("failed", [0, 1, 3])
def test_exit_rule(failed):
    import typer
    from nego.cli.errors import exit_for_errors
    from rich.console import Console

    frame = pl.DataFrame({"end_reason": ["error"] * failed + ["agreement"] * (3 - failed), "error": ["x"] * 3})
    console = Console(record=True, width=120)
    if failed == 3:
        with pytest.raises(typer.Exit) as stopped:
            exit_for_errors(frame, console)
        assert stopped.value.exit_code == 1
    else:
        exit_for_errors(frame, console)
    text = console.export_text()
    assert ("warning: 1 of 3" in text) == (failed == 1) and (text == "") == (failed == 0)
