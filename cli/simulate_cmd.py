"""``nego simulate``: a Mesa market of sellers and buyers over market days, with a live view and transcripts."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import polars as pl
import typer
from nego.market.events import EventBus
from nego.market.locks import DirectoryBusy, exclusive_run
from nego.market.protocol import ProtocolConfig
from nego.market.summary import summarize
from nego.market.transcripts import TranscriptWriter, read_negotiations
from rich.console import Console
from rich.table import Table

from .live import LiveView, MarketWatch, PlainProgress, stats_table
from .options import (
    BaseUrl,
    MaxTokens,
    ModelOptions,
    PerKind,
    Prices,
    Temperature,
    Template,
    Tools,
    parse_per_kind,
    parse_specs,
)

if TYPE_CHECKING:
    from nego.market.population import ScenarioSource

DEFAULT_SELLERS = "boulware,linear,conceder,tft"
DEFAULT_BUYERS = "boulware,conceder,tft,walker"


@dataclass(frozen=True)
class SimulateConfig:
    """One simulation: who trades, for how long, on what, and where the transcripts go."""

    sellers: tuple[str, ...] = tuple(DEFAULT_SELLERS.split(","))
    buyers: tuple[str, ...] = tuple(DEFAULT_BUYERS.split(","))
    days: int = 5
    negotiations: int = 32
    """Seller and buyer agents each; at most this many negotiations a day (fewer as stock or demand run out)."""
    inventory: int = 60
    demand: int = 40
    scenarios: str | None = None
    """A scenario file, a directory of them, 'builtin', a suite name, plugin:NAME or py:MODULE:ATTR; None draws from
    the generator."""
    seed: int = 0
    concurrency: int = 256
    per_kind: dict[str, int] = field(default_factory=dict)
    max_retries: int = 2
    turn_timeout_s: float | None = None
    out: Path | None = None
    model: ModelOptions = field(default_factory=ModelOptions)

    def __post_init__(self) -> None:
        for name in ("days", "negotiations", "inventory", "demand", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not self.sellers or not self.buyers:
            raise ValueError("give at least one seller spec and one buyer spec")

    @property
    def out_dir(self) -> Path:
        return self.out or Path("runs") / f"simulate-seed{self.seed}"


def load_scenario_source(source: str) -> ScenarioSource:
    """Scenarios from a file, a directory, 'builtin', the name of an evaluation suite, or a plugin source
    (``plugin:NAME`` or ``py:MODULE:ATTR``: a list, or a ``seed -> Scenario`` function)."""
    from nego.scenarios.files import builtin_scenarios, load_scenarios

    if source == "builtin":
        return [s for _, s in builtin_scenarios()]
    if source.startswith(("plugin:", "py:")):
        from nego.agents.plugins import load_scenario_source as load_plugin_source

        return load_plugin_source(source)
    path = Path(source)
    try:
        exists = path.exists()
    except (OSError, ValueError):  # a name no file system takes (a NUL byte, too long): not a file, maybe a suite
        exists = False
    if exists:
        try:
            return load_scenarios(path)  # a bad file raises ScenarioFileError naming the file and the field
        except OSError as e:  # a directory that cannot be listed
            raise ValueError(f"--scenarios {source}: cannot read it ({e.strerror or e})") from None
    if path.suffix in (".toml", ".json") or "/" in source:
        raise ValueError(f"--scenarios {source}: no such file or directory")
    from nego.evaluation.suites import load_suite

    try:
        return list(load_suite(source).scenarios)
    except (KeyError, ValueError) as e:
        raise ValueError(f"--scenarios {source!r} is not a file, a directory, 'builtin' or a suite ({e})") from None


@dataclass(frozen=True)
class SimulationResult:
    out_dir: Path
    negotiations: pl.DataFrame
    days: pl.DataFrame
    skipped: int


def run_simulation(
    cfg: SimulateConfig, *, bus: EventBus | None = None, console: Console | None = None, live: bool = False
) -> SimulationResult:
    """Run the market described by ``cfg``, writing transcripts to ``cfg.out_dir`` (resuming what is there)."""
    from nego.agents.registry import resolve
    from nego.market.population import BuyerSetup, MarketModel, SellerSetup

    settings = cfg.model.settings()
    factories = {spec: resolve(spec, settings) for spec in {*cfg.sellers, *cfg.buyers}}  # fail fast on a bad spec
    scenarios = load_scenario_source(cfg.scenarios) if cfg.scenarios else None
    sellers = [SellerSetup(cfg.sellers[i % len(cfg.sellers)], cfg.inventory) for i in range(cfg.negotiations)]
    buyers = [BuyerSetup(cfg.buyers[i % len(cfg.buyers)], cfg.demand) for i in range(cfg.negotiations)]
    bus = bus or EventBus()
    console = console or Console()
    watch = MarketWatch(expected=cfg.days * cfg.negotiations)
    bus.subscribe(watch)
    with exclusive_run(cfg.out_dir, f"nego simulate --out {cfg.out_dir}"):
        writer = TranscriptWriter(cfg.out_dir, flush_every=256)
        skipped = len(writer.completed_ids())
        protocol = ProtocolConfig(max_retries=cfg.max_retries, turn_timeout_s=cfg.turn_timeout_s)
        model = MarketModel(
            factories,
            sellers,
            buyers,
            scenarios=scenarios,
            days=cfg.days,
            seed=cfg.seed,
            run_id=f"simulate-{cfg.seed}",
            concurrency=cfg.concurrency,
            per_kind=cfg.per_kind,
            protocol=protocol,
            bus=bus,
            writer=writer,
        )
        with model, writer:
            try:
                if live:
                    with LiveView(watch, console=console):
                        days = model.run()
                else:
                    bus.subscribe(PlainProgress(watch, console))
                    days = model.run()
            finally:
                model.run_coroutine(model.market.aclose())
    negotiations = read_negotiations(cfg.out_dir, latest=True)
    return SimulationResult(cfg.out_dir, negotiations, days, skipped)


def print_summary(result: SimulationResult, console: Console) -> None:
    """The end-of-run tables: per seller and per buyer spec, per day, and where the transcripts are."""
    labels = {
        "spec": "spec",
        "n": "n",
        "deal_rate": "deal rate",
        "mean_seller_utility": "u_seller",
        "mean_buyer_utility": "u_buyer",
        "mean_rounds": "rounds",
        "invalid_rate": "invalid",
        "errors": "errors",
        "tokens": "tokens",
        "cost_usd": "cost $",
    }
    for by in ("seller", "buyer"):
        table = Table(title=f"Summary per {by} (utilities: mean over negotiations; no deal = reservation)")
        for col, label in labels.items():
            table.add_column(label, justify="left" if col == "spec" else "right")
        for row in summarize(result.negotiations, by=by).sort("spec").iter_rows(named=True):
            table.add_row(*(_cell(row[c]) for c in labels))
        console.print(table)
    day_cols = {
        "day": "day",
        "pairs": "pairs",
        "deals": "deals",
        "errors": "errors",
        "units": "units",
        "revenue": "revenue",
        "mean_seller_utility": "u_seller",
        "mean_buyer_utility": "u_buyer",
        "inventory_left": "stock left",
        "demand_left": "demand left",
    }
    days = Table(title="Market days")
    for label in day_cols.values():
        days.add_column(label, justify="right")
    for row in result.days.iter_rows(named=True):
        days.add_row(*(_cell(row[c]) for c in day_cols))
    console.print(days)
    if result.skipped:
        console.print(f"resumed: {result.skipped} negotiations were already complete on disk", highlight=False)
    console.print(f"transcripts: {result.out_dir}/negotiations and {result.out_dir}/turns (Parquet)", highlight=False)


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def simulate(
    sellers: Annotated[str, typer.Option(help="Comma-separated seller specs (see `nego agents`).")] = DEFAULT_SELLERS,
    buyers: Annotated[str, typer.Option(help="Comma-separated buyer specs.")] = DEFAULT_BUYERS,
    days: Annotated[int, typer.Option(help="Market days to simulate.")] = SimulateConfig.days,
    negotiations: Annotated[int, typer.Option(help="Sellers and buyers each: at most this many deals a day.")] = 32,
    scenarios: Annotated[
        str | None,
        typer.Option(
            help="Scenario FILE, DIR, 'builtin', a suite name, plugin:NAME or py:MODULE:ATTR; default: generated."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed: same seed and options, same transcripts.")] = 0,
    concurrency: Annotated[int, typer.Option(help="Negotiations in flight at most.")] = 256,
    inventory: Annotated[int, typer.Option(help="Units each seller starts with.")] = SimulateConfig.inventory,
    demand: Annotated[int, typer.Option(help="Units each buyer wants.")] = SimulateConfig.demand,
    out: Annotated[
        Path | None, typer.Option(help="Transcript directory (default runs/simulate-seed<SEED>); rerun to resume.")
    ] = None,
    live: Annotated[bool | None, typer.Option("--live/--no-live", help="Rich live view (default: on a TTY).")] = None,
    per_kind: PerKind = None,
    base_url: BaseUrl = None,
    template: Template = None,
    tools: Tools = None,
    temperature: Temperature = None,
    max_tokens: MaxTokens = None,
    prices: Prices = None,
    turn_timeout: Annotated[
        float | None, typer.Option(help="Seconds one move may take; past it the negotiation ends as an error.")
    ] = None,
) -> None:
    """Run a marketplace of negotiating sellers and buyers over market days and summarise it."""
    console = Console()
    try:
        cfg = SimulateConfig(
            sellers=parse_specs(sellers, "seller"),
            buyers=parse_specs(buyers, "buyer"),
            days=days,
            negotiations=negotiations,
            scenarios=scenarios,
            seed=seed,
            concurrency=concurrency,
            inventory=inventory,
            demand=demand,
            out=out,
            per_kind=parse_per_kind(per_kind),
            turn_timeout_s=turn_timeout,
            model=ModelOptions(base_url, template, tools, prices, temperature, max_tokens),
        )
        use_live = console.is_terminal if live is None else live
        result = run_simulation(cfg, console=console, live=use_live and console.is_terminal)
    except (ValueError, DirectoryBusy) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    print_summary(result, console)


__all__ = ["SimulateConfig", "SimulationResult", "print_summary", "run_simulation", "simulate", "stats_table"]

if __name__ == "__main__":  # pragma: no cover
    logging.basicConfig(stream=sys.stderr)
