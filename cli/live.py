"""The live view of a running market: ongoing negotiations, a ticker of deals, running statistics, progress.

Market events only update small in-memory structures (O(1) each); rendering happens on rich's refresh thread
at a fixed rate, so a busy market does not wait for the terminal. Without a terminal, :class:`PlainProgress`
prints a line per market day and at most one progress line every few seconds.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from nego.market.events import (
    DayEnded,
    DayStarted,
    EndKind,
    LearnerUpdated,
    NegotiationEnded,
    NegotiationStarted,
    TurnPlayed,
)
from nego.market.marketplace import Job
from nego.market.rates import deal_rate, invalid_per_move, moves
from nego.market.summary import RunningStats
from nego.market.types import ActionKind
from nego.scenarios.scenario import Role
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .errors import plain
from .tables import Layout

MAX_ROWS = 12
TICKER = 8


@dataclass(slots=True)
class _DayCell:
    n: int = 0
    deals: int = 0
    utility: float = 0.0
    invalid: int = 0
    moves: int = 0
    version: int = 0

    def add(self, event: NegotiationEnded) -> None:
        o = event.result.outcome
        self.n += 1
        self.deals += o.agreed
        self.utility += o.seller_utility
        self.invalid += o.invalid_seller
        self.moves += moves(event.result, Role.SELLER)
        self.version = max(self.version, event.job.policy_version or 0)


def learning_table(watch: MarketWatch, last: int = 6) -> Table:
    """The learning sellers' last days (utility, deal rate, invalid moves per move, policy version) beside the fixed
    sellers, and each learner's latest update."""
    table = Table(title="Learning seller by day (beside the fixed sellers)", expand=True)
    for col in ("day", "version", "u_seller", "deal rate", "invalid per move", "others u", "others deal"):
        table.add_column(col, justify="right")
    days = sorted({d for d, _ in watch.by_day})[-last:]
    for day in days:
        mine, others = watch.by_day.get((day, True)), watch.by_day.get((day, False))
        table.add_row(
            str(day),
            str(mine.version) if mine else "-",
            _fmt(mine.utility / mine.n) if mine else "-",
            _fmt(deal_rate(mine.deals, mine.n)) if mine else "-",
            _fmt(invalid_per_move(mine.invalid, mine.moves), ".3f") if mine else "-",
            _fmt(others.utility / others.n) if others else "-",
            _fmt(deal_rate(others.deals, others.n)) if others else "-",
        )
    updates = [
        f"{spec}: version {u.report.policy_version} after day {u.day} ({u.report.updates} update(s), "
        f"{u.report.pending} group(s) waiting)"
        for spec, u in watch.learners.items()
    ]
    table.caption = Text("; ".join(updates), style="table.caption")
    return table


@dataclass(slots=True)
class _Ongoing:
    job: Job
    last: TurnPlayed | None = None


class MarketWatch:
    """Subscribe to an :class:`~nego.market.events.EventBus`; keeps what the live view and the plain progress show.

    Handlers only store references; all text is formatted when a frame is drawn.
    """

    def __init__(self, expected: int) -> None:
        self.expected = max(1, expected)
        self.done = 0
        self.deals = 0
        self.errors = 0
        self.day = 0
        self.stats = RunningStats()
        self.ongoing: dict[str, _Ongoing] = {}
        self.ticker: deque[NegotiationEnded] = deque(maxlen=TICKER)
        self.started = time.perf_counter()
        self.learners: dict[str, LearnerUpdated] = {}
        """The latest update of each learner in the market."""
        self.by_day: dict[tuple[int, bool], _DayCell] = {}
        """Per (day, learning?) running sums over the negotiations that did not fail."""

    def __call__(self, event: object) -> None:
        if isinstance(event, TurnPlayed):
            row = self.ongoing.get(event.negotiation_id)
            if row is not None:
                row.last = event
        elif isinstance(event, NegotiationStarted):
            self.ongoing[event.job.negotiation_id] = _Ongoing(event.job)
        elif isinstance(event, NegotiationEnded):
            self.ongoing.pop(event.job.negotiation_id, None)
            self.stats(event)
            self.done += 1
            kind = event.kind
            if kind is EndKind.ERROR:
                self.errors += 1
                self.ticker.appendleft(event)
            elif kind is EndKind.DEAL:
                self.deals += 1
                self.ticker.appendleft(event)
            if event.job.day is not None and kind is not EndKind.ERROR:
                key = (event.job.day, event.job.policy_version is not None)
                self.by_day.setdefault(key, _DayCell()).add(event)
        elif isinstance(event, DayStarted):
            self.day = event.day
        elif isinstance(event, LearnerUpdated):
            self.learners[event.spec] = event

    @property
    def rate(self) -> float:
        """Negotiations finished per second since the watch started."""
        return self.done / max(1e-9, time.perf_counter() - self.started)


def _ongoing_cells(row: _Ongoing) -> tuple[str, ...]:
    job, last = row.job, row.last
    if last is None:
        return (f"{job.seller} vs {job.buyer}", job.scenario.id, "0", "", "-", "-")
    turn = last.turn
    if not turn.valid:
        move = f"{turn.role}: invalid"
    elif turn.action.kind is ActionKind.OFFER and turn.action.offer is not None:
        move = f"{turn.role}: {turn.action.offer.describe()}"
    else:
        move = f"{turn.role}: {turn.action.kind.value}"
    return (
        f"{job.seller} vs {job.buyer}",
        job.scenario.id,
        str(turn.round),
        move,
        _fmt(last.standing_seller),
        _fmt(last.standing_buyer),
    )


def _ticker_line(event: NegotiationEnded) -> str:
    job, o = event.job, event.result.outcome
    pair = f"{plain(job.seller)} vs {plain(job.buyer)}"
    if event.kind is EndKind.ERROR:
        return f"[red]error[/] {pair}: {plain(o.error)}"
    deal = o.agreement.describe() if o.agreement is not None else ""
    return (
        f"[green]deal[/] {pair} on {plain(job.scenario.id)} "
        f"(u_s={o.seller_utility:.2f}, u_b={o.buyer_utility:.2f}): {plain(deal)}"
    )


def deal_tape(watch: MarketWatch, title: str = "Recent deals") -> Panel:
    """The tape of the latest deals (and errors), newest first."""
    ticker = Table.grid(expand=True)
    ticker.add_column(overflow="ellipsis", no_wrap=True)
    for event in list(watch.ticker):
        ticker.add_row(_ticker_line(event))
    return Panel(ticker, title=f"{title} ({watch.deals} so far, {watch.errors} errors)", height=TICKER + 2)


def _fmt(u: float | None, spec: str = ".2f") -> str:
    return "-" if u is None else format(u, spec)


def stats_table(watch: MarketWatch, title: str = "Sellers") -> Table:
    """Running statistics per seller spec (spec names are never cut)."""
    headers = ("seller", "n", "deal rate", "mean u_seller", "mean u_buyer", "rounds", "invalid per move", "errors")
    rows = [
        (
            row["spec"],
            str(row["n"]),
            _fmt(row["deal_rate"]),
            _fmt(row["mean_seller_utility"]),
            _fmt(row["mean_buyer_utility"]),
            _fmt(row["mean_rounds"]),
            _fmt(row["invalid_rate"]),
            str(row["errors"]),
        )
        for row in watch.stats.frame("seller").iter_rows(named=True)
    ]
    return Layout.of(headers, rows).table(title, expand=True)


class LiveView:
    """A rich live display driven by a :class:`MarketWatch`; use as a context manager around the run."""

    def __init__(self, watch: MarketWatch, console: Console | None = None, refresh_per_second: float = 4) -> None:
        self.watch = watch
        self.progress = Progress(
            TextColumn("[bold]negotiations"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:.0f}/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self._task = self.progress.add_task("market", total=watch.expected, rate=0.0)
        self.live = Live(get_renderable=self.render, console=console, refresh_per_second=refresh_per_second)

    def render(self) -> Group:
        w = self.watch
        self.progress.update(self._task, completed=w.done, total=max(w.expected, w.done), rate=w.rate)
        ongoing = Table(title=f"Day {w.day}: negotiations in progress ({len(w.ongoing)})", expand=True)
        for col in ("pair", "scenario", "round", "last move", "u_seller", "u_buyer"):
            ongoing.add_column(col, overflow="ellipsis", no_wrap=True)
        for row in list(w.ongoing.values())[:MAX_ROWS]:
            ongoing.add_row(*map(Text, _ongoing_cells(row)))  # names, ids and offer values, printed as they are
        parts = [ongoing, deal_tape(w), stats_table(w)]
        if w.learners or any(learning for _, learning in w.by_day):
            parts.append(learning_table(w))
        return Group(*parts, self.progress)

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)


PLAIN_WIDTH = 80
"""Columns a plain progress line fits in (a terminal's, or a log viewer's, default width)."""


def _packed(items: list[str], indent: str) -> list[str]:
    """``items`` joined by commas into indented lines of at most :data:`PLAIN_WIDTH` columns (an item is never
    split; one longer than a line gets a line of its own)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= PLAIN_WIDTH:
            lines[-1] += ", " + item
        else:
            lines.append(indent + item)
    return lines


class PlainProgress:
    """Progress as plain lines for logs and pipes, each fitting :data:`PLAIN_WIDTH` columns for the usual sizes of a
    market: one line per market day (and per learner update, its metrics on indented lines below), at most one
    more every ``every_s``. The count goes on from what ``watch`` holds when it starts (what a resumed run settled
    from its transcripts); the rate counts only what is played now."""

    def __init__(self, watch: MarketWatch, console: Console, every_s: float = 5.0) -> None:
        self.watch, self.console, self.every_s = watch, console, every_s
        self._last = time.perf_counter()
        self._settled = watch.done

    def __call__(self, event: object) -> None:
        w = self.watch
        if isinstance(event, DayEnded):
            self._print(
                f"day {event.day}: {event.deals}/{event.negotiations} deals, {event.errors} errors, "
                f"{event.units} units, revenue {event.revenue:,.0f}  [{w.done}/{w.expected} done]"
            )
        elif isinstance(event, LearnerUpdated):
            r = event.report
            self._print(
                f"day {event.day}: {event.spec} learned: {r.updates} update(s), version {r.policy_version}, "
                f"{r.pending} group(s) waiting"
            )
            metrics = [f"{k} {v:.3f}" for k, v in r.metrics.items() if k != "seconds"]
            for line in _packed(metrics, indent="  "):
                self._print(line)
        elif isinstance(event, NegotiationEnded) and time.perf_counter() - self._last > self.every_s:
            self._last = time.perf_counter()
            rate = (w.done - self._settled) / max(1e-9, self._last - w.started)
            self._print(f"{w.done}/{w.expected} negotiations, {w.deals} deals, {rate:.0f}/s")

    def _print(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False)
