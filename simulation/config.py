"""Configuration of a simulation, as a dataclass the CLI fills.

Each field's help text is in its metadata, where ``nego simulate`` takes its options from; defaults are written
here only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nego.agents.model_options import ModelOptions
from nego.agents.threads import THREADS_HELP

DEFAULT_SELLERS = "boulware,linear,conceder,tft"
DEFAULT_BUYERS = "boulware,conceder,tft,walker"
DEFAULT_LEARN_BUYERS = "boulware,conceder,tft,reciprocal"
"""The default buyers of a market a seller learns in: no held-out evaluation family (walker is one), so that an
evaluation of the learned policy against the held-out buyers stays held out."""


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
    workers: int = _f(
        1,
        "Processes playing the negotiations (1: this one). Same transcripts for any number; rule and remote/API "
        "agents only (not --learn, nor models loaded in this process).",
    )
    learn: str | None = _f(
        None,
        "A seller that learns while the market runs: a registered model (tiny, NAME-rl), hf:PATH (GRPO), or "
        "'tuner' (a UCB concession tuner); it trades as NAME-learning beside --sellers. With it the default buyers are "
        f"{DEFAULT_LEARN_BUYERS}, and held-out evaluation families (walker, picky) are refused as buyers.",
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
            "workers": 1,
            "learn_sellers": 1,
            "learn_group": 1,
            "learn_batch": 1,
        }
        for name, low in least.items():
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")
        if not self.sellers or not self.buyers:
            raise ValueError("give at least one seller spec and one buyer spec")
        if self.learn and self.workers > 1:
            raise ValueError("--learn learns from its episodes in this process: run it with --workers 1")
        if self.learn:
            self._keep_held_out_buyers_out()

    def _keep_held_out_buyers_out(self) -> None:
        """A learner never trades with a held-out evaluation family: the default market swaps walker for the
        reciprocating buyer, a market that names one is refused."""
        from nego.agents.registry import rule_family
        from nego.agents.rules.heldout import HELD_OUT_FAMILIES

        if self.buyers == tuple(DEFAULT_BUYERS.split(",")):
            object.__setattr__(self, "buyers", tuple(DEFAULT_LEARN_BUYERS.split(",")))
        held = [b for b in self.buyers if rule_family(b) in HELD_OUT_FAMILIES]
        if held:
            raise ValueError(
                f"--buyers {held[0]}: a learning seller never trades with a held-out evaluation family "
                f"({', '.join(HELD_OUT_FAMILIES)}), so evaluations of what it learns against them stay held out"
            )

    @property
    def out_dir(self) -> Path:
        return self.out or Path("runs") / f"simulate-seed{self.seed}"
