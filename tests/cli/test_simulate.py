"""`nego simulate`: the embedded default runs, writes transcripts, resumes, and rejects bad input clearly."""

from __future__ import annotations

import sys

import polars as pl
import pytest
from nego.cli.app import app
from nego.cli.live import LiveView, MarketWatch
from nego.cli.simulate_cmd import ConsoleView
from nego.market.events import EventBus
from nego.market.transcripts import read_negotiations, read_turns
from nego.simulation import SimulateConfig, run_simulation
from rich.console import Console
from typer.testing import CliRunner

runner = CliRunner()


def test_simulate_smoke_writes_transcripts_and_summary(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["simulate", "--days", "2", "--negotiations", "6", "--out", str(out), "--no-live"])
    assert res.exit_code == 0, res.output
    assert "Summary per seller" in res.output and "transcripts:" in res.output
    neg = read_negotiations(out, latest=True)
    assert neg.height == 12
    assert set(neg["seller"]) == {"boulware", "linear", "conceder", "tft"}
    assert read_turns(out).height == int(neg["turns"].sum())


def test_rerun_resumes_and_adds_nothing(tmp_path):
    cfg = SimulateConfig(days=2, negotiations=5, out=tmp_path / "r", seed=3)
    first = run_simulation(cfg)
    again = run_simulation(cfg)
    assert again.skipped == first.negotiations.height == 10
    assert read_negotiations(cfg.out_dir).height == 10  # no duplicated rows
    assert first.days.equals(again.days)  # stored results settle the market exactly as played ones


def test_same_seed_same_transcripts(tmp_path):
    a = run_simulation(SimulateConfig(days=2, negotiations=4, seed=7, out=tmp_path / "a"))
    b = run_simulation(SimulateConfig(days=2, negotiations=4, seed=7, out=tmp_path / "b"))
    cols = ["negotiation_id", "seller", "buyer", "seller_utility", "buyer_utility", "rounds", "end_reason"]
    assert a.negotiations.sort("negotiation_id").select(cols).equals(b.negotiations.sort("negotiation_id").select(cols))


def test_unknown_spec_fails_before_running(tmp_path):
    out = tmp_path / "x"
    res = runner.invoke(app, ["simulate", "--sellers", "nonsense-agent", "--out", str(out), "--no-live"])
    assert res.exit_code == 2
    assert "nonsense-agent" in res.output and "boulware" in res.output  # names the known specs
    assert not (out / "negotiations").exists() or not any((out / "negotiations").iterdir())


def test_an_error_names_a_long_path_on_one_line_whatever_the_terminal_width(tmp_path):
    """A path in an error message is printed whole, so it can be copied: rich does not break it at the width."""
    deep = tmp_path.joinpath(*["a-folder-with-a-long-name"] * 6, "bike.toml")
    deep.parent.mkdir(parents=True)
    deep.write_bytes(b"[scenario\n")  # not TOML
    for columns in ("40", "80"):
        res = runner.invoke(app, ["simulate", "--scenarios", str(deep), "--no-live"], env={"COLUMNS": columns})
        assert res.exit_code != 0 and str(deep) in res.output, res.output


def test_live_view_renders_from_events(tmp_path):
    bus = EventBus()
    console = Console(file=open(tmp_path / "screen.txt", "w"), force_terminal=True, width=120)  # noqa: SIM115
    watch = MarketWatch(expected=8)
    bus.subscribe(watch)
    cfg = SimulateConfig(days=1, negotiations=8, out=tmp_path / "live")
    run_simulation(cfg, bus=bus, observer=ConsoleView(console, live=True))
    assert watch.done == 8 and watch.deals + watch.errors <= 8
    view = LiveView(watch, console=console)
    console.print(view.render())
    console.file.close()
    screen = (tmp_path / "screen.txt").read_text()
    assert "Recent deals" in screen and "boulware" in screen


def test_simulate_never_imports_torch_or_sdks(tmp_path):
    import subprocess

    code = (
        "import sys; from nego.cli.simulate_cmd import ConsoleView; from nego.simulation import SimulateConfig, "
        "run_simulation; from rich.console import Console; "
        f"cfg = SimulateConfig(days=1, negotiations=2, out={str(tmp_path / 's')!r}); "
        "run_simulation(cfg, observer=ConsoleView(Console(quiet=True))); "
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'openai', 'anthropic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")


def test_the_library_runs_a_simulation_without_the_cli_or_its_printing(tmp_path):
    import subprocess

    code = (
        "import sys; from nego.simulation import SimulateConfig, run_simulation; "
        f"r = run_simulation(SimulateConfig(days=1, negotiations=2, out={str(tmp_path / 'lib')!r})); "
        "print(r.negotiations.height, sorted(m for m in sys.modules if m.startswith(('nego.cli', 'typer', 'rich'))))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "2 []"  # and nothing else printed


@pytest.mark.parametrize("bad", [["--days", "0"], ["--negotiations", "-1"], ["--scenarios", "/no/such/file.toml"]])
def test_bad_options_are_rejected(tmp_path, bad):
    res = runner.invoke(app, ["simulate", "--out", str(tmp_path / "b"), "--no-live", *bad])
    assert res.exit_code == 2, res.output
    assert "error" in res.output.lower() or "invalid" in res.output.lower()


def test_agents_lists_specs():
    res = runner.invoke(app, ["agents"])
    assert res.exit_code == 0 and "boulware" in res.output


def test_specs_with_several_parameters_survive_the_comma_list(tmp_path):
    from nego.cli.options import parse_specs

    assert parse_specs("timedep:e=1,patience=0.5, tft,walker:k=4,delta=0.02", "buyer") == (
        "timedep:e=1,patience=0.5",
        "tft",
        "walker:k=4,delta=0.02",
    )
    out = tmp_path / "run"
    args = ["simulate", "--days", "1", "--negotiations", "4", "--out", str(out), "--no-live"]
    res = runner.invoke(app, [*args, "--buyers", "timedep:e=1,patience=0.5,tft"])
    assert res.exit_code == 0, res.output
    assert set(read_negotiations(out, latest=True)["buyer"]) <= {"timedep:e=1,patience=0.5", "tft"}


def test_a_second_simulation_on_a_directory_in_use_fails_without_writing(tmp_path):
    from nego.market.locks import exclusive_run

    out = tmp_path / "busy"
    with exclusive_run(out, "nego simulate --out busy"):
        res = runner.invoke(app, ["simulate", "--days", "1", "--negotiations", "2", "--out", str(out), "--no-live"])
    assert res.exit_code == 2
    assert "in use by nego simulate --out busy" in " ".join(res.output.split())
    assert not (out / "negotiations").exists()


def _simulate(out, days: int, kill_after_day: int | None = None) -> tuple[list[str], bool]:
    """``nego simulate`` in a subprocess with plain output; with ``kill_after_day``, SIGKILLed as soon as that day's
    line is printed. Its lines, and whether it was killed before it finished."""
    import os
    import signal
    import subprocess

    args = ["simulate", "--no-live", "--out", str(out), "--days", str(days), "--negotiations", "6", "--seed", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "nego.cli.app", *args], stdout=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if kill_after_day is not None and line.startswith(f"day {kill_after_day}:"):
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return lines, proc.returncode == -signal.SIGKILL
        assert proc.wait(timeout=300) == 0, "\n".join(lines)
        return lines, False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_then_resumed_simulation_counts_the_negotiations_it_settles_from_its_transcripts(tmp_path):
    out = tmp_path / "run"
    _, killed = _simulate(out, 30, kill_after_day=2)
    assert killed
    settled = read_negotiations(out, latest=True).filter(pl.col("end_reason") != "error").height
    assert 12 <= settled < 180  # days 1 and 2 at least were on disk, and not the whole run
    lines, _ = _simulate(out, 30)
    days = [line for line in lines if line.startswith("day ") and ":" in line.split()[1]]
    assert read_negotiations(out, latest=True).height == 180 and len(days) == 30
    assert days[-1].endswith("[180/180 done]"), days[-1]  # not [180 - settled/180]: the settled ones count too
    assert days[0].endswith(f"[{settled}/180 done]")
    assert f"resumed: {settled} negotiations were already complete on disk" in lines


def test_every_line_of_a_plain_simulation_fits_80_columns_unwrapped(tmp_path, monkeypatch):
    import re

    monkeypatch.chdir(tmp_path)  # the default output directory, as a user's first run would have it
    res = runner.invoke(app, ["simulate", "--days", "3", "--no-live"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    # nego's own lines are whole: none was wrapped onto a second line to fit
    day = re.compile(r"day \d: \d+/32 deals, \d+ errors, \d+ units, revenue [\d,]+  \[\d+/96 done\]")
    assert sum(bool(day.fullmatch(line)) for line in lines) == 3, res.output
    assert lines[-1] == "transcripts: negotiations/ and turns/ (Parquet) in runs/simulate-seed0"


def test_plain_progress_puts_a_learner_update_and_its_metrics_on_lines_of_80_columns():
    from nego.cli.live import PlainProgress
    from nego.market.events import LearnerUpdated
    from nego.market.learning import LearnReport

    console = Console(width=1000, record=True)
    metrics = {f"metric_{i}": i / 7 for i in range(12)} | {"seconds": 3.0}
    report = LearnReport(policy_version=7, updates=2, pending=1, metrics=metrics)
    PlainProgress(MarketWatch(expected=10), console)(LearnerUpdated(4, "tiny-learning", report))
    lines = console.export_text().splitlines()
    assert lines[0] == "day 4: tiny-learning learned: 2 update(s), version 7, 1 group(s) waiting"
    assert max(len(line) for line in lines) <= 80 and all(line.startswith("  metric_") for line in lines[1:])
    shown = ", ".join(line.strip() for line in lines[1:]).split(", ")
    assert shown == [f"metric_{i} {i / 7:.3f}" for i in range(12)]  # every metric, whole, in order; seconds not shown
