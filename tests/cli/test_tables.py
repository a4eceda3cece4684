"""Summary tables on an 80-column terminal: every spec name in full, nothing past the right edge."""

from __future__ import annotations

import polars as pl
from nego.cli.eval_cmd import summary_tables
from nego.cli.live import MarketWatch, stats_table
from nego.cli.simulate_cmd import print_summary
from nego.cli.tables import Layout
from nego.market.events import EventBus
from nego.simulation import SimulateConfig, run_simulation
from rich.console import Console

SELLERS = ("boulware", "conceder", "timedep:e=0.3", "linear")
BUYERS = ("walker:k=4,delta=0.02", "picky", "boulware")


def _screen(*renderables, width: int = 80) -> list[str]:
    console = Console(width=width, record=True)
    for r in renderables:
        console.print(r)
    return console.export_text().splitlines()


def test_simulation_summary_and_live_table_keep_every_spec_whole_at_80_columns(tmp_path):
    bus, watch = EventBus(), MarketWatch(expected=12)
    bus.subscribe(watch)
    cfg = SimulateConfig(sellers=SELLERS, buyers=BUYERS, days=2, negotiations=6, out=tmp_path / "run")
    result = run_simulation(cfg, bus=bus)
    console = Console(width=80, record=True)
    print_summary(result, console)
    lines = console.export_text().splitlines()
    live = _screen(stats_table(watch))
    for screen, specs in ((lines, {*SELLERS, *BUYERS}), (live, set(SELLERS))):
        firsts = {line.split()[0] for line in screen if line.strip()}
        assert specs <= firsts, specs - firsts  # each spec opens a row, uncut
        assert max(len(line.rstrip()) for line in screen) <= 80
    assert any(line.startswith("deal rate") or "deal rate" in line for line in lines)


def comparisons() -> pl.DataFrame:
    rows = []
    for group in ("suite", "walker:k=4,delta=0.02", "anthropic:claude-haiku-4-5"):
        for arm in ("4.5b", "openai:gpt-5-mini", "4.5b-rl"):
            base = arm == "4.5b"
            gain = (
                {} if base else {"gain": 0.141, "gain_low": -0.124, "gain_high": 0.16, "p_value": 2e-5, "p_holm": 0.03}
            )
            rows.append(
                {"group": group, "arm": arm, "n": 1152, "clusters": 96, "score": 0.512, "score_low": 0.498}
                | {"score_high": 0.527, "deal_rate": 0.81, "gain": None, "gain_low": None, "gain_high": None}
                | {"p_value": None, "p_holm": None}
                | gain
            )
    return pl.DataFrame(rows)


def test_evaluation_tables_keep_every_arm_and_buyer_whole_at_80_columns():
    lines = _screen(*summary_tables(comparisons(), 80))
    text = "\n".join(lines)
    assert max(len(line.rstrip()) for line in lines) <= 80
    for name in ("walker:k=4,delta=0.02", "anthropic:claude-haiku-4-5"):
        assert f"buyer {name}" in text
    firsts = [line.split()[0] for line in lines if line.strip()]
    assert {"4.5b", "openai:gpt-5-mini", "4.5b-rl"} <= set(firsts)
    for value in ("0.512", "[0.498,0.527]", "+0.141", "[-0.124,+0.160]", "2.0e-05", "0.0300", "0.81", "1152"):
        assert value in text, value  # wrapped, never cut
    wide = "\n".join(_screen(*summary_tables(comparisons(), 200), width=200))
    assert "scenarios" in wide and "scenarios" not in text  # the optional column goes first on a narrow screen


def test_a_layout_drops_optional_columns_in_order_only_when_it_must():
    layout = Layout.of(["name", "a", "bb", "c"], [["x" * 30, "1", "22", "333"]])
    assert layout.least_width() == 30 + 1 + 2 + 3 + 4 * 2
    assert layout.fit(44, ("bb", "a")).headers == ("name", "a", "bb", "c")
    assert layout.fit(43, ("bb", "a")).headers == ("name", "a", "c")
    assert layout.fit(10, ("bb", "a")).headers == ("name", "c")
    assert layout.fit(43, ("bb",)).rows == (("x" * 30, "1", "333"),)
