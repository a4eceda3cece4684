"""The training log: one row per logged GRPO step in a Parquet file, with collapse flagged as it happens."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
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


class TrainObserver(Protocol):
    """Sees every logged step and every dev evaluation as it happens (the live view of ``nego train`` is one)."""

    def on_step(self, row: Mapping[str, Any]) -> None: ...

    def on_dev(self, dev: DevEvaluation) -> None: ...


class TrainLog:
    """Collects rows and rewrites ``path`` atomically after each one (a crash never leaves a broken file)."""

    def __init__(
        self, path: Path, stats: RolloutStats, echo: Any = print, observer: TrainObserver | None = None
    ) -> None:
        self.path = path
        self.stats = stats
        self.echo = echo
        self.observer = observer
        self.rows: list[dict[str, Any]] = []
        self.baseline: float | None = None
        self._entropies: list[float] = []

    def add(self, step: int, logs: dict[str, float], step_seconds: float) -> dict[str, Any]:
        row: dict[str, Any] = {"step": step}
        for key, name in _TRL_KEYS.items():
            v = logs.get(key)
            row[name] = float(v) if v is not None and math.isfinite(float(v)) else None
        s = self.stats
        row.update(
            deal_rate=s.deal_rate,
            invalid_rate=s.invalid_rate,
            rollout_utility=s.utility,
            rollout_seconds=s.seconds,
            step_seconds=step_seconds,
            tokens_per_s=s.tokens / step_seconds if step_seconds > 0 else None,
            generated_tokens=s.generated,
            over_cap=s.over_cap,
        )
        if s.over_cap:
            self.echo(
                f"warning: step {step}: {s.over_cap} episode(s) ran over max_tokens and were left out of the loss "
                "(raise --max-tokens, or lower --max-rounds)"
            )
        if row["entropy"] is not None and len(self._entropies) < 3:
            self._entropies.append(row["entropy"])
            self.baseline = sum(self._entropies) / len(self._entropies)
        row["collapse"] = collapse_reason(row["entropy"], self.baseline, row["identical_group_share"])
        if row["collapse"]:
            self.echo(f"warning: step {step} looks collapsed: {row['collapse']}")
        self.rows.append(row)
        self.write()
        if self.observer is not None:
            self.observer.on_step(row)
        return row

    def add_eval(self, dev: DevEvaluation) -> None:
        for buyer, summary in dev.summary().items():
            self.rows.append({"step": dev.step, "dev_buyer": buyer, **{f"dev_{k}": v for k, v in summary.items()}})
        self.write()
        if self.observer is not None:
            self.observer.on_dev(dev)

    def write(self) -> None:
        import polars as pl

        tmp = self.path.with_suffix(".tmp")
        pl.DataFrame(self.rows, infer_schema_length=None).write_parquet(tmp)
        os.replace(tmp, self.path)
