"""``nego simulate``: a Mesa market of sellers and buyers over market days, with a live view and transcripts."""

from __future__ import annotations

import inspect
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import polars as pl
import typer
from nego.agents.threads import THREADS_HELP, set_threads
from nego.market.events import EventBus
from nego.market.locks import DirectoryBusy, exclusive_run
from nego.market.protocol import ProtocolConfig
from nego.market.summary import learning_days, summarize
from nego.market.transcripts import TranscriptWriter, read_negotiations
from rich.console import Console
from rich.table import Table

from .config_options import config_options, given_values, parameters, signature
from .errors import exit_for_errors
from .live import LiveView, MarketWatch, PlainProgress, stats_table
from .options import ModelOptions, model_parameters, take_model_options
from .tables import Layout

if TYPE_CHECKING:
    from nego.market.population import ScenarioSource

DEFAULT_SELLERS = "boulware,linear,conceder,tft"
DEFAULT_BUYERS = "boulware,conceder,tft,walker"


def _f(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class SimulateConfig:
    """One simulation: who trades, for how long, on what, and where the transcripts go."""

    sellers: tuple[str, ...] = _f(
        tuple(DEFAULT_SELLERS.split(",")), "Comma-separated seller specs (see `nego agents`)."
    )
    buyers: tuple[str, ...] = _f(tuple(DEFAULT_BUYERS.split(",")), "Comma-separated buyer specs.")
    days: int = _f(5, "Market days to simulate.")
    negotiations: int = _f(32, "Sellers and buyers each: at most this many deals a day.")
    inventory: int = _f(60, "Units each seller starts with.")
    demand: int = _f(40, "Units each buyer wants.")
    scenarios: str | None = _f(
        None, "Scenario FILE, DIR, 'builtin', a suite name, plugin:NAME or py:MODULE:ATTR; default: generated."
    )
    seed: int = _f(0, "Seed: same seed and options, same transcripts.")
    concurrency: int = _f(256, "Negotiations in flight at most.")
    per_kind: dict[str, int] = field(default_factory=dict)
    """Concurrency caps per agent kind (``--per-kind``, shared with ``nego eval``)."""
    max_retries: int = _f(2, "Retries after an invalid move before the turn is forfeited.")
    turn_timeout_s: float | None = _f(
        None, "Seconds one move may take; past it the negotiation ends as an error.", flag="--turn-timeout"
    )
    out: Path | None = field(
        default=None, metadata={"help": "Transcript directory (default runs/simulate-seed<SEED>); rerun to resume."}
    )
    threads: int = _f(0, THREADS_HELP)
    learn: str | None = _f(
        None,
        "A seller that learns while the market runs: a registered model (tiny, NAME-rl), hf:PATH (GRPO), or "
        "'tuner' (a UCB concession tuner); it trades as NAME-learning beside --sellers.",
    )
    learn_sellers: int = _f(4, "Seller agents trading under the learning spec (and as many more buyers).")
    learn_group: int = _f(4, "Negotiations each learning pair plays of its scenario per day: its GRPO group.")
    learn_batch: int = _f(4, "Groups per policy update; groups that do not fill one wait for the next day.")
    learn_lr: float = _f(0.0, "Learning rate of a GRPO learner (0: the model's training default).")
    model: ModelOptions = field(default_factory=ModelOptions)
    """Model agents' settings (the shared ``--base-url``, ``--template``, ... options)."""

    def __post_init__(self) -> None:
        least = {
            "days": 1,
            "negotiations": 1,
            "inventory": 1,
            "demand": 1,
            "concurrency": 1,
            "max_retries": 0,
            "threads": 0,
            "learn_sellers": 1,
            "learn_group": 1,
            "learn_batch": 1,
        }
        for name, low in least.items():
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")
        if not self.sellers or not self.buyers:
            raise ValueError("give at least one seller spec and one buyer spec")

    @property
    def out_dir(self) -> Path:
        return self.out or Path("runs") / f"simulate-seed{self.seed}"


OPTIONS = config_options(SimulateConfig)


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
    registered: list[str] = field(default_factory=list)
    """Models the run's learners registered (``nego simulate --learn``)."""


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
    n_buyers = cfg.negotiations + (cfg.learn_sellers if cfg.learn else 0)
    buyers = [BuyerSetup(cfg.buyers[i % len(cfg.buyers)], cfg.demand) for i in range(n_buyers)]
    bus = bus or EventBus()
    console = console or Console()
    watch = MarketWatch(expected=cfg.days * n_buyers)
    bus.subscribe(watch)
    with exclusive_run(cfg.out_dir, f"nego simulate --out {cfg.out_dir}"):
        learners = []
        if cfg.learn:
            learner = _learner(cfg, console)
            learners.append(learner)
            sellers += [SellerSetup(learner.spec, cfg.inventory) for _ in range(cfg.learn_sellers)]
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
            learners=learners,
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
        registered = [_register(learner, cfg) for learner in learners]
    negotiations = read_negotiations(cfg.out_dir, latest=True)
    return SimulationResult(cfg.out_dir, negotiations, days, skipped, [r for r in registered if r])


def _learner(cfg: SimulateConfig, console: Console):
    """The learner ``--learn`` names, its state under the run directory (``learners/SPEC``)."""
    from nego.training.learners import learner_spec, make_learner

    assert cfg.learn is not None
    return make_learner(
        cfg.learn,
        cfg.out_dir / "learners" / learner_spec(cfg.learn),
        group_size=cfg.learn_group,
        groups_per_update=cfg.learn_batch,
        lr=cfg.learn_lr,
        seed=cfg.seed,
        threads=cfg.threads,
        echo=lambda line: console.print(line, highlight=False, markup=False),
    )


def _register(learner: object, cfg: SimulateConfig) -> str:
    """Register a GRPO learner's policy as ``SPEC-simSEED`` once it has been updated; '' if nothing to register."""
    register = getattr(learner, "register", None)
    if register is None or not getattr(learner, "policy_version", 0):
        return ""
    name = f"{learner.spec}-sim{cfg.seed}"  # type: ignore[attr-defined]
    register(name)
    return name


SPEC_COLUMNS = {
    "n": ("n", "{:d}"),
    "deal_rate": ("deal rate", "{:.2f}"),
    "mean_seller_utility": ("u_seller", "{:.3f}"),
    "mean_buyer_utility": ("u_buyer", "{:.3f}"),
    "mean_rounds": ("rounds", "{:.1f}"),
    "invalid_rate": ("invalid", "{:.3f}"),
    "errors": ("errors", "{:d}"),
}
USAGE_COLUMNS = {"tokens": ("tokens", "{:,d}"), "cost_usd": ("cost $", "{:,.4f}")}
DAY_COLUMNS = {
    "day": ("day", "{:d}"),
    "pairs": ("pairs", "{:d}"),
    "deals": ("deals", "{:d}"),
    "errors": ("errors", "{:d}"),
    "units": ("units", "{:,d}"),
    "revenue": ("revenue", "{:,.0f}"),
    "mean_seller_utility": ("u_seller", "{:.3f}"),
    "mean_buyer_utility": ("u_buyer", "{:.3f}"),
    "inventory_left": ("stock left", "{:,d}"),
    "demand_left": ("demand left", "{:,d}"),
}


LEARNING_COLUMNS = {
    "day": ("day", "{:d}"),
    "policy_version": ("version", "{:d}"),
    "n": ("n", "{:d}"),
    "utility": ("u_seller", "{:.3f}"),
    "deal_rate": ("deal rate", "{:.2f}"),
    "invalid_rate": ("invalid", "{:.3f}"),
    "others_utility": ("others u", "{:.3f}"),
    "others_deal_rate": ("others deal", "{:.2f}"),
}


def print_summary(result: SimulationResult, console: Console) -> None:
    """The end-of-run tables: per seller and per buyer spec (and model usage, if any), per day, and where the
    transcripts are. Spec names are never cut, whatever the terminal's width."""
    width = console.width
    tables = []
    for by in ("seller", "buyer"):
        summary = summarize(result.negotiations, by=by).sort("spec")
        title = f"Summary per {by} (mean utilities; no deal = reservation)"
        tables.append(_table(title, summary, SPEC_COLUMNS, width, "spec", optional=("invalid", "rounds")))
        if (summary["tokens"].fill_null(0) > 0).any() or (summary["cost_usd"].fill_null(0) > 0).any():
            tables.append(_table(f"Model usage per {by}", summary, USAGE_COLUMNS, width, "spec"))
    tables.append(_table("Market days", result.days, DAY_COLUMNS, width, optional=("demand left", "stock left")))
    learning = learning_days(result.negotiations)
    if learning.height:
        title = "Learning seller per day (its rollouts included) beside the fixed sellers"
        tables.append(_table(title, learning, LEARNING_COLUMNS, width, "seller", optional=("n", "invalid")))
    for table in tables:
        console.print()
        console.print(table)
    if result.skipped:
        console.print(f"resumed: {result.skipped} negotiations were already complete on disk", highlight=False)
    console.print(f"transcripts: {result.out_dir}/negotiations and {result.out_dir}/turns (Parquet)", highlight=False)
    for name in result.registered:
        console.print(f"registered {name}: the learning seller's policy at the end of the run", highlight=False)


def _table(
    title: str,
    frame: pl.DataFrame,
    columns: dict[str, tuple[str, str]],
    width: int,
    name: str | None = None,
    optional: tuple[str, ...] = (),
) -> Table:
    headers = ([name] if name else []) + [label for label, _ in columns.values()]
    rows = [
        ([row[name]] if name else []) + [_cell(row[col], fmt) for col, (_, fmt) in columns.items()]
        for row in frame.iter_rows(named=True)
    ]
    layout = Layout.of(headers, rows, names=1 if name else 0).fit(width, optional)
    return layout.table(title, title_justify="left")


def _cell(v: object, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def simulate(**values: Any) -> None:
    """Run a marketplace of negotiating sellers and buyers over market days and summarise it."""
    console = Console()
    live = values.pop("live", None)
    try:
        model, per_kind = take_model_options(values)
        cfg = SimulateConfig(**given_values(OPTIONS, values), per_kind=per_kind, model=model)
        set_threads(cfg.threads)
        use_live = console.is_terminal if live is None else live
        result = run_simulation(cfg, console=console, live=use_live and console.is_terminal)
    except (ValueError, DirectoryBusy) as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    print_summary(result, console)
    exit_for_errors(result.negotiations, console, "negotiations")


simulate.__signature__ = signature(  # type: ignore[attr-defined]
    parameters(OPTIONS),
    [
        inspect.Parameter(
            "live",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                bool | None, typer.Option("--live/--no-live", help="Rich live view (default: on a TTY).")
            ],
        )
    ],
    model_parameters(),
)

__all__ = ["SimulateConfig", "SimulationResult", "print_summary", "run_simulation", "simulate", "stats_table"]

if __name__ == "__main__":  # pragma: no cover
    logging.basicConfig(stream=sys.stderr)
