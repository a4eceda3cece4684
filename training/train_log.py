"""The training log: one typed row per GRPO step (and per dev buyer at each dev evaluation) in a Parquet file, with
collapse flagged as it happens. ``nego train`` and the in-market learner write the same rows."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from .evaluate import DevEvaluation
from .rollout import RolloutStats

COLLAPSE_ENTROPY_RATIO = 0.3
COLLAPSE_IDENTICAL_SHARE = 0.5

_TRL_KEYS = {
    "reward": "reward_mean",
    "reward_std": "reward_std",
    "kl": "kl",
    "entropy": "entropy",
    "frac_reward_zero_std": "identical_group_share",
    "loss": "loss",
    "learning_rate": "learning_rate",
    "grad_norm": "grad_norm",
}


def collapse_reason(entropy: float | None, baseline: float | None, identical: float | None) -> str:
    """Why this step looks collapsed ('' if it does not): sampling entropy fell below a third of its start,
    or most groups had identical rewards (zero advantage, nothing to learn)."""
    reasons = []
    if entropy is not None and baseline and entropy < COLLAPSE_ENTROPY_RATIO * baseline:
        reasons.append(f"entropy {entropy:.3f} < {COLLAPSE_ENTROPY_RATIO:.0%} of initial {baseline:.3f}")
    if identical is not None and identical > COLLAPSE_IDENTICAL_SHARE:
        reasons.append(f"{identical:.0%} of groups had identical rewards")
    return "; ".join(reasons)


def _finite(logs: Mapping[str, Any], key: str) -> float | None:
    v = logs.get(key)
    try:
        f = float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    """One GRPO step: TRL's numbers (reward, KL, entropy, loss, ...), what the rollouts looked like, and timing.

    A run that is not fed by market rollouts of its own (the in-market learner, whose groups the market played)
    leaves the rollout fields empty and says which ``day`` it learned on and how stale its oldest episode was."""

    step: int
    reward_mean: float | None
    reward_std: float | None
    kl: float | None
    entropy: float | None
    identical_group_share: float | None
    loss: float | None
    learning_rate: float | None
    grad_norm: float | None
    deal_rate: float | None = None
    invalid_rate: float | None = None
    """Invalid seller actions per seller turn, in this step's rollouts."""
    rollout_utility: float | None = None
    rollout_seconds: float | None = None
    step_seconds: float
    tokens_per_s: float | None = None
    generated_tokens: int | None = None
    over_cap: int | None = None
    collapse: str = ""
    day: int | None = None
    max_policy_lag: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class DevRow:
    """One dev buyer's result at one dev evaluation."""

    step: int
    dev_buyer: str
    dev_utility: float
    dev_deal_rate: float
    dev_invalid_per_episode: float
    dev_n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TrainObserver(Protocol):
    """Sees every logged step and every dev evaluation as it happens (the live view of ``nego train`` is one)."""

    def on_step(self, row: Mapping[str, Any]) -> None: ...

    def on_dev(self, dev: DevEvaluation) -> None: ...


class TrainLog:
    """Collects rows and rewrites ``path`` atomically after each one (a crash never leaves a broken file).

    ``resume_step`` keeps the rows an earlier attempt logged up to that step (a resumed run logs the rest), so the
    file of a resumed run holds every step once."""

    def __init__(
        self,
        path: Path,
        stats: RolloutStats | None = None,
        echo: Any = print,
        observer: TrainObserver | None = None,
        *,
        resume_step: int | None = None,
    ) -> None:
        self.path = path
        self.stats = stats
        self.echo = echo
        self.observer = observer
        self.rows: list[StepRow | DevRow] = []
        self.kept: list[dict[str, Any]] = _earlier_rows(path, resume_step) if resume_step is not None else []
        self.baseline: float | None = None
        self._entropies: list[float] = []

    def add(self, step: int, logs: Mapping[str, Any], step_seconds: float, **context: Any) -> StepRow:
        """The row of ``step`` from TRL's ``logs`` and the last rollouts' statistics (``context``: day, policy lag)."""
        trl = {name: _finite(logs, key) for key, name in _TRL_KEYS.items()}
        s = self.stats
        rollout: dict[str, Any] = {}
        if s is not None:
            rollout = dict(
                deal_rate=s.deal_rate,
                invalid_rate=s.invalid_rate,
                rollout_utility=s.utility,
                rollout_seconds=s.seconds,
                tokens_per_s=s.tokens / step_seconds if step_seconds > 0 else None,
                generated_tokens=s.generated,
                over_cap=s.over_cap,
            )
            if s.over_cap:
                self.echo(
                    f"warning: step {step}: {s.over_cap} episode(s) ran over max_tokens and were left out of the "
                    "loss (raise --max-tokens, or lower --max-rounds)"
                )
        entropy = trl["entropy"]
        if entropy is not None and len(self._entropies) < 3:
            self._entropies.append(entropy)
            self.baseline = sum(self._entropies) / len(self._entropies)
        collapse = collapse_reason(entropy, self.baseline, trl["identical_group_share"])
        if collapse:
            self.echo(f"warning: step {step} looks collapsed: {collapse}")
        row = StepRow(step=step, step_seconds=step_seconds, collapse=collapse, **trl, **rollout, **context)
        self.rows.append(row)
        self.write()
        if self.observer is not None:
            self.observer.on_step(row.to_dict())
        return row

    def add_eval(self, dev: DevEvaluation) -> None:
        for buyer, r in dev.summary().items():
            self.rows.append(
                DevRow(dev.step, buyer, r["utility"], r["deal_rate"], r["invalid_per_episode"], int(r["n"]))
            )
        self.write()
        if self.observer is not None:
            self.observer.on_dev(dev)

    def write(self) -> None:
        import polars as pl

        tmp = self.path.with_suffix(".tmp")
        rows = self.kept + [r.to_dict() for r in self.rows]
        pl.DataFrame(rows, infer_schema_length=None).write_parquet(tmp)
        os.replace(tmp, self.path)


def _earlier_rows(path: Path, through: int) -> list[dict[str, Any]]:
    """The rows of ``path`` up to step ``through`` (its dev evaluation was logged before its checkpoint)."""
    if not path.exists():
        return []
    import polars as pl

    frame = pl.read_parquet(path).filter(pl.col("step") <= through)
    return [{k: v for k, v in row.items() if v is not None} for row in frame.to_dicts()]
