"""`nego simulate`: the embedded default runs, writes transcripts, resumes, and rejects bad input clearly."""

from __future__ import annotations

import sys

import pytest
from nego.cli.app import app
from nego.cli.live import LiveView, MarketWatch
from nego.cli.simulate_cmd import SimulateConfig, run_simulation
from nego.market.events import EventBus
from nego.market.transcripts import read_negotiations, read_turns
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
    first = run_simulation(cfg, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    again = run_simulation(cfg, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    assert again.skipped == first.negotiations.height == 10
    assert read_negotiations(cfg.out_dir).height == 10  # no duplicated rows
    assert first.days.equals(again.days)  # stored results settle the market exactly as played ones


def test_same_seed_same_transcripts(tmp_path):
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    a = run_simulation(SimulateConfig(days=2, negotiations=4, seed=7, out=tmp_path / "a"), console=quiet)
    b = run_simulation(SimulateConfig(days=2, negotiations=4, seed=7, out=tmp_path / "b"), console=quiet)
    cols = ["negotiation_id", "seller", "buyer", "seller_utility", "buyer_utility", "rounds", "end_reason"]
    assert a.negotiations.sort("negotiation_id").select(cols).equals(b.negotiations.sort("negotiation_id").select(cols))


def test_unknown_spec_fails_before_running(tmp_path):
    out = tmp_path / "x"
    res = runner.invoke(app, ["simulate", "--sellers", "nonsense-agent", "--out", str(out), "--no-live"])
    assert res.exit_code == 2
    assert "nonsense-agent" in res.output and "boulware" in res.output  # names the known specs
    assert not (out / "negotiations").exists() or not any((out / "negotiations").iterdir())


def test_live_view_renders_from_events(tmp_path):
    bus = EventBus()
    console = Console(file=open(tmp_path / "screen.txt", "w"), force_terminal=True, width=120)  # noqa: SIM115
    watch = MarketWatch(expected=8)
    bus.subscribe(watch)
    cfg = SimulateConfig(days=1, negotiations=8, out=tmp_path / "live")
    run_simulation(cfg, bus=bus, console=console, live=True)
    assert watch.done == 8 and watch.deals + watch.errors <= 8
    view = LiveView(watch, console=console)
    console.print(view.render())
    console.file.close()
    screen = (tmp_path / "screen.txt").read_text()
    assert "Recent deals" in screen and "boulware" in screen


def test_simulate_never_imports_torch_or_sdks(tmp_path):
    import subprocess

    code = (
        "import sys; from nego.cli.simulate_cmd import SimulateConfig, run_simulation; "
        "from rich.console import Console; "
        f"cfg = SimulateConfig(days=1, negotiations=2, out={str(tmp_path / 's')!r}); "
        "run_simulation(cfg, console=Console(quiet=True)); "
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'openai', 'anthropic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")


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
