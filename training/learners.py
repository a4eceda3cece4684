"""The learners ``nego simulate --learn SPEC`` can put in a market (see :mod:`nego.market.learning`).

``tuner`` is the UCB concession tuner (no model); a registered model (``tiny``, ``NAME-rl``, a chat model) or
``hf:PATH`` learns with GRPO (:class:`~nego.training.market_learner.GRPOLearner`). Their state lives under the
simulation's own directory, so rerunning the same command resumes market and learner together.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nego.market.learning import Learner

TUNER = "tuner"


def learner_spec(base: str) -> str:
    """The seller spec a learner trades under in the market (and in the transcripts)."""
    if base == TUNER:
        return "tuner-learning"
    return f"{base.removeprefix('hf:').rstrip('/').rsplit('/', 1)[-1]}-learning"


def make_learner(
    base: str,
    directory: Path,
    *,
    group_size: int,
    groups_per_update: int,
    lr: float = 0.0,
    seed: int = 0,
    threads: int = 0,
    echo: Callable[[str], None] = print,
) -> Learner:
    """A learner for ``base``, keeping its state under ``directory``."""
    spec = learner_spec(base)
    if base == TUNER:
        from .tuner import ConcessionTuner

        return ConcessionTuner(directory, spec=spec, group_size=group_size)
    from .config import TrainConfig
    from .market_learner import GRPOLearner

    if group_size < 2:
        raise ValueError(f"--learn-group must be >= 2 for a GRPO learner (a group compares outcomes), got {group_size}")
    cfg = TrainConfig(
        group_size=group_size, scenarios_per_step=groups_per_update, lr=lr, seed=seed, threads=threads
    ).validate()
    return GRPOLearner(base, cfg, directory, spec=spec, echo=echo)
