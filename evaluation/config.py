"""Configuration of an evaluation run and of a sweep, as dataclasses the CLI and TOML files fill."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .stats import DEFAULT_RESAMPLES
from .suites import DEFAULT_BUYERS, DIAGNOSTIC_BUYER


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """One evaluation: every seller arm against the suite's held-out buyers, plus the diagnostic buyer."""

    sellers: tuple[str, ...]
    """Seller specs; the first is the base every later arm is compared with."""
    out: Path
    """Run directory: transcripts, metrics and the report go here; rerunning resumes."""
    suite: str = "eval-1152"
    """A built-in suite name or a suite JSON path."""
    buyers: tuple[str, ...] = DEFAULT_BUYERS
    """One buyer spec per buyer slot of the suite."""
    diagnostic: str | None = DIAGNOSTIC_BUYER
    """Extra buyer reported apart (one seed per scenario and opener); None to skip."""
    concurrency: int = 64
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    """Seed of the bootstrap and permutation resampling."""
    optimality_gap: bool = True
    """Replay rule-based buyers to compute the optimality gap."""
    per_kind: Mapping[str, int] = field(default_factory=dict)
    """Concurrency caps per agent kind (e.g. {"openai": 16}), on top of ``concurrency``."""
    play: Mapping[str, Any] = field(default_factory=dict)
    """How model agents are played (template, temperature, max tokens, tools): recorded in ``run.json``, and a
    rerun into the same directory with other values is refused, so one run never mixes two ways of playing."""

    def __post_init__(self) -> None:
        if not self.sellers:
            raise ValueError("give at least one seller spec (--sellers A,B)")
        if len(set(self.sellers)) != len(self.sellers):
            raise ValueError(f"seller specs must be distinct, got {list(self.sellers)}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.resamples < 1_000:
            raise ValueError(f"resamples must be >= 1000 for a stable 95% interval, got {self.resamples}")


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """A study grid: every model size x learning rate x seed trained, then evaluated on one suite."""

    out: Path
    sizes: tuple[str, ...] = ("tiny",)
    learning_rates: tuple[float, ...] = (1e-5, 1e-4, 3e-4)
    seeds: tuple[int, ...] = (0,)
    suite: str = "eval-dev"
    buyers: tuple[str, ...] = DEFAULT_BUYERS
    diagnostic: str | None = DIAGNOSTIC_BUYER
    train_args: dict[str, Any] = field(default_factory=dict)
    """Extra training settings (fields of ``nego.training.config.TrainConfig``), e.g. {"steps": 20}."""
    concurrency: int = 64
    resamples: int = DEFAULT_RESAMPLES

    def __post_init__(self) -> None:
        if not self.sizes or not self.learning_rates or not self.seeds:
            raise ValueError("a sweep needs at least one size, one learning rate and one seed")
        bad = [lr for lr in self.learning_rates if not lr > 0]
        if bad:
            raise ValueError(f"learning rates must be positive, got {bad}")


_SWEEP_KEYS = {
    "out",
    "sizes",
    "learning_rates",
    "seeds",
    "suite",
    "buyers",
    "diagnostic",
    "train",
    "concurrency",
    "resamples",
}


def load_sweep_config(path: Path) -> SweepConfig:
    """Read a sweep TOML file (``[sweep]`` table, optional ``[sweep.train]`` options); errors name the key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: cannot read sweep config: {e}") from e
    table = data.get("sweep")
    if not isinstance(table, dict):
        raise ValueError(f"{path}: needs a [sweep] table with sizes, learning_rates, seeds, suite")
    unknown = set(table) - _SWEEP_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key(s) in [sweep]: {sorted(unknown)}; allowed: {sorted(_SWEEP_KEYS)}")
    out = Path(table.get("out", Path(path).with_suffix("")))
    if not out.is_absolute():
        out = Path(path).parent / out
    try:
        return SweepConfig(
            out=out,
            sizes=tuple(str(s) for s in table.get("sizes", ("tiny",))),
            learning_rates=tuple(float(x) for x in table.get("learning_rates", (1e-5, 1e-4, 3e-4))),
            seeds=tuple(int(x) for x in table.get("seeds", (0,))),
            suite=str(table.get("suite", "eval-dev")),
            buyers=tuple(str(b) for b in table.get("buyers", DEFAULT_BUYERS)),
            diagnostic=table.get("diagnostic", DIAGNOSTIC_BUYER) or None,
            train_args=dict(table.get("train", {})),
            concurrency=int(table.get("concurrency", 64)),
            resamples=int(table.get("resamples", 10_000)),
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: bad value in [sweep]: {e}") from e
