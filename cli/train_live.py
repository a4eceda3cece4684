"""The live view of ``nego train``: reward, deal-rate and entropy curves, the latest step, dev evaluations and a
collapse warning, redrawn by rich while GRPO runs.

:class:`TrainWatch` is a :class:`~nego.training.train_log.TrainObserver`: the training log hands it every row as it
is written, and it only stores them; text is formatted when a frame is drawn.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from nego.training.evaluate import DevEvaluation

BLOCKS = "▁▂▃▄▅▆▇█"
CURVE_WIDTH = 64
CURVES = (
    ("reward", "reward_mean", "green"),
    ("deal rate", "deal_rate", "cyan"),
    ("entropy", "entropy", "magenta"),
    ("invalid per move", "invalid_rate", "yellow"),
)


def sparkline(values: Sequence[float | None], width: int = CURVE_WIDTH) -> str:
    """``values`` as at most ``width`` block characters, low to high; longer series are averaged into ``width``
    equal buckets, so the whole run stays in view. Missing values (None, NaN) are skipped."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs or width < 1:
        return ""
    if len(xs) > width:
        edges = [round(i * len(xs) / width) for i in range(width + 1)]
        xs = [sum(xs[a:b]) / (b - a) for a, b in itertools.pairwise(edges) if b > a]
    lo, hi = min(xs), max(xs)
    top = len(BLOCKS) - 1
    if hi - lo < 1e-12:
        return BLOCKS[top // 2] * len(xs)
    return "".join(BLOCKS[round((x - lo) / (hi - lo) * top)] for x in xs)


class TrainWatch:
    """Keeps what the training live view shows: every logged step, the dev evaluations, and the tape of deals of the
    negotiations training plays (it watches the episode runner's market through :attr:`bus`)."""

    def __init__(self, steps: int, name: str = "", time_budget_min: float = 0.0) -> None:
        from nego.market.events import EventBus

        from .live import MarketWatch

        self.bus = EventBus()
        self.market = MarketWatch(expected=0)
        self.bus.subscribe(self.market)
        self.steps = max(1, steps)
        self.name = name
        self.time_budget_min = time_budget_min
        self.rows: list[Mapping[str, Any]] = []
        self.dev: dict[int, DevEvaluation] = {}
        self.started = time.perf_counter()

    def on_step(self, row: Mapping[str, Any]) -> None:
        self.rows.append(row)

    def on_dev(self, dev: DevEvaluation) -> None:
        self.dev[dev.step] = dev

    def render(self) -> Group:
        parts: list[Any] = [self._header()]
        if self.rows:
            parts.append(self._curves())
        collapse = self.rows[-1].get("collapse") if self.rows else ""
        if collapse:
            parts.append(Panel(Text(f"step {self.rows[-1]['step']} looks collapsed: {collapse}"), style="bold red"))
        if self.dev:
            parts.append(self._dev_table())
        if self.market.done:
            from .live import deal_tape

            parts.append(deal_tape(self.market, "Deals in training negotiations"))
        return Group(*parts)

    def _header(self) -> Text:
        elapsed = time.perf_counter() - self.started
        step = int(self.rows[-1]["step"]) if self.rows else 0
        text = f"nego train {self.name}: GRPO step {step}/{self.steps}, {elapsed / 60:.1f} min"
        if self.rows:
            seconds = [r["step_seconds"] for r in self.rows[-10:] if r.get("step_seconds")]
            if seconds:
                text += f", {sum(seconds) / len(seconds):.1f} s/step"
        else:
            text += " (warm start and base evaluation first)"
        if self.time_budget_min:
            text += f"; stops at {self.time_budget_min:g} min of run time"
        return Text(text, style="bold")

    def _curves(self) -> Table:
        table = Table(title=f"training curves (steps 1..{self.rows[-1]['step']})", title_justify="left", box=None)
        for col in ("", "first", "curve", "latest", "min", "max"):
            table.add_column(col, justify="left" if col in ("", "curve") else "right")
        for label, key, colour in CURVES:
            values = [r[key] for r in self.rows if r.get(key) is not None and math.isfinite(float(r[key]))]
            if not values:
                continue
            table.add_row(
                label,
                f"{values[0]:.3f}",
                Text(sparkline(values), style=colour),
                f"{values[-1]:.3f}",
                f"{min(values):.3f}",
                f"{max(values):.3f}",
            )
        last = self.rows[-1]
        extra = []
        if last.get("identical_group_share") is not None:
            extra.append(f"identical-reward groups {last['identical_group_share']:.2f}")
        if last.get("kl") is not None:
            extra.append(f"KL {last['kl']:.4f}")
        if last.get("tokens_per_s"):
            extra.append(f"{last['tokens_per_s']:,.0f} tokens/s")
        if extra:
            table.caption = ", ".join(extra)
            table.caption_justify = "left"
        return table

    def _dev_table(self) -> Table:
        steps = sorted(self.dev)
        buyers = [r.buyer for r in self.dev[steps[-1]].buyers]
        table = Table(title="dev split (utility / deal rate), sampled as trained", title_justify="left")
        table.add_column("step", justify="right")
        for b in buyers:
            table.add_column(Text(b), justify="right")  # a buyer spec, printed as it is
        for step in steps[-6:]:
            results = {r.buyer: r for r in self.dev[step].buyers}
            cells = [f"{r.mean_utility:.3f} / {r.deal_rate:.2f}" if (r := results.get(b)) else "-" for b in buyers]
            table.add_row(str(step), *cells)
        return table
