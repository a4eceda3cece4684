"""Text from outside nego prints as it is: rich reads square brackets as markup, which would drop ``[seller]`` from an
error message, cut ``r[x]`` out of a path, and raise on a stray closing tag in a scenario's context or a model's error
(in the live view, on rich's refresh thread, mid-run)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from nego.agents.registry import resolve
from nego.cli.app import app
from nego.cli.live import LiveView, MarketWatch, deal_tape
from nego.cli.tables import Layout
from nego.market.events import NegotiationEnded, NegotiationStarted, TurnPlayed
from nego.market.marketplace import Job, error_result
from nego.market.protocol import run_negotiation
from nego.scenarios.files import builtin_scenarios, save_scenario
from nego.scenarios.scenario import Role
from rich.console import Console
from typer.testing import CliRunner

runner = CliRunner()
TRICKY = "[/bold] tricky [internal] [red]"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _screen(*renderables: object, width: int = 200) -> str:
    console = Console(width=width, record=True)
    for r in renderables:
        console.print(r)
    return console.export_text()


def _scenario():
    return next(s for _, s in builtin_scenarios() if s.id == "office-chairs")


def test_scenario_text_with_square_brackets_is_shown_as_written(tmp_path: Path) -> None:
    scenario = dataclasses.replace(_scenario(), id="chairs[x]", context=f"{TRICKY} context", product="[b]chairs")
    path = save_scenario(scenario, tmp_path / "tricky.toml")
    res = runner.invoke(app, ["scenarios", "show", str(path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert f"{TRICKY} context" in res.output
    assert "chairs[x]" in res.output and "[b]chairs" in res.output


def test_a_scenario_file_error_names_the_tables_it_asks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "x"\nproduct = "y"\n')
    for args in (["scenarios", "show", str(bad)], ["simulate", "--scenarios", str(bad), "--no-live"]):
        res = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert res.exit_code in (1, 2), res.output
        out = _flat(res.output)
        assert "add at least one [[issues]] table" in out, out
        assert "add a [seller] table" in out and "add a [buyer] table" in out, out


def test_a_run_directory_with_square_brackets_is_printed_whole(tmp_path: Path) -> None:
    out = tmp_path / "r[x]" / "run"
    args = ["simulate", "--days", "1", "--negotiations", "2", "--no-live", "--out", str(out)]
    res = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert f"in {out}" in _flat(res.output)


def test_live_view_shows_names_ids_and_errors_as_they_are() -> None:
    scenario = dataclasses.replace(_scenario(), id="chairs[/i]")
    deal_job = Job(scenario, "boulware", "conceder", seed=1)
    failed_job = Job(scenario, "py:agents[x]:Seller", "conceder", seed=2)
    turns: list = []
    result = asyncio.run(
        run_negotiation(scenario, resolve("boulware")(Role.SELLER, 1), resolve("conceder")(Role.BUYER, 2), seed=1,
                        on_turn=turns.append)
    )  # fmt: skip
    assert result.outcome.agreement is not None
    watch = MarketWatch(expected=3)
    watch(NegotiationEnded(deal_job, 0, result, 0.1))
    watch(NegotiationEnded(failed_job, 0, error_result(failed_job, f"ValueError: {TRICKY}"), 0.1))
    ongoing = Job(scenario, "[bold]seller", "conceder", seed=3)
    watch(NegotiationStarted(ongoing, 0))
    watch(TurnPlayed(ongoing.negotiation_id, turns[0], 0.9, 0.1))
    tape = _flat(_screen(deal_tape(watch)))
    assert f"error py:agents[x]:Seller vs conceder: ValueError: {TRICKY}" in tape, tape
    assert "deal boulware vs conceder on chairs[/i]" in tape, tape
    screen = _flat(_screen(LiveView(watch).render()))
    assert "[bold]seller vs conceder" in screen and "chairs[/i]" in screen, screen


def test_layout_cells_and_title_print_as_they_are() -> None:
    layout = Layout.of(["spec", "score"], [["tft[/b]", "[red]0.5"]])
    screen = _screen(layout.table("buyer [walker]"))
    assert "tft[/b]" in screen and "[red]0.5" in screen and "buyer [walker]" in screen
