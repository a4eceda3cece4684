"""``nego simulate``: the command over :func:`nego.simulation.run_simulation`. Its options come from
:class:`~nego.simulation.SimulateConfig`; it shows the run (:class:`ConsoleView`), prints the end-of-run tables and
sets the exit status."""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import polars as pl
import typer
from nego.agents.threads import set_threads
from nego.market.events import EventBus
from nego.market.locks import DirectoryBusy
from nego.market.summary import learning_days, summarize
from nego.simulation import RunStart, SimulateConfig, SimulationResult, run_simulation
from rich.console import Console
from rich.table import Table

from .config_options import config_options, given_values, parameters, signature
from .errors import exit_for_errors, print_error
from .live import LiveView, MarketWatch, PlainProgress, stats_table
from .options import model_parameters, take_model_options
from .tables import Layout

OPTIONS = config_options(SimulateConfig)


class ConsoleView:
    """Shows a simulation on a console: the learner's notes, then the rich live view (``live``) or plain progress
    lines, both counting the negotiations a resumed run settles from its transcripts."""

    def __init__(self, console: Console, *, live: bool = False) -> None:
        self.console, self.live = console, live

    def note(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False)

    @contextmanager
    def watching(self, start: RunStart, bus: EventBus) -> Iterator[None]:
        watch = MarketWatch(expected=start.expected)
        watch.done = start.settled  # so that a resumed run ends at its full count, as the run it resumes would
        bus.subscribe(watch)
        if self.live:
            with LiveView(watch, console=self.console):
                yield
        else:
            bus.subscribe(PlainProgress(watch, self.console))
            yield


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
    console.print(f"transcripts: negotiations/ and turns/ (Parquet) in {result.out_dir}", highlight=False, markup=False)
    for name in result.registered:
        console.print(f"registered {name}: the learning seller's final policy", highlight=False, markup=False)


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
        result = run_simulation(cfg, observer=ConsoleView(console, live=use_live and console.is_terminal))
    except (ValueError, DirectoryBusy, OSError) as e:  # OSError: an --out it cannot create or write, a full disk
        print_error(console, str(e))
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

__all__ = ["ConsoleView", "print_summary", "simulate", "stats_table"]

if __name__ == "__main__":  # pragma: no cover
    logging.basicConfig(stream=sys.stderr)
