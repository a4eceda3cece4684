"""League buyers: the learning seller's own earlier policy, frozen and played on the buyer side.

A training pool entry ``league:every=N`` is a buyer whose strategy is the policy being trained as it was at the last
multiple of ``N`` GRPO steps (the warm start until step ``N``): a self-play opponent refreshed on a fixed schedule,
so the seller keeps meeting a buyer that bargains the way it has learned to. The compact protocol describes a
negotiation in the acting side's own utilities, so the seller's policy plays the buyer side as it is.

Each snapshot is saved under the run directory (``league/every-N/step-000040``) before it plays, so a resumed run
meets the opponents the first one met. A negotiation's buyer spec names the snapshot it played
(``league:every=40,at=40``), in the transcripts as everywhere else. League buyers need the tiny model (a copy of a
real model's weights per refresh is not what this is for) and at least one other pool entry: the warm start
records its transcripts against those.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nego.agents.compact.protocol import CompactFactory, CompactPolicy

LEAGUE = "league"
_EVERY = re.compile(r"\s*every\s*=\s*(\d+)\s*")


def league_every(spec: str) -> int | None:
    """``N`` of a ``league:every=N`` spec, None for any other spec; a malformed league spec raises ConfigError."""
    from .config import ConfigError

    name, _, params = spec.strip().partition(":")
    if name.strip().lower() != LEAGUE:
        return None
    m = _EVERY.fullmatch(params)
    if m is None or int(m[1]) < 1:
        raise ConfigError(
            f"train_buyers: {spec!r}: a league buyer is written league:every=N, N >= 1 GRPO steps between refreshes"
        )
    return int(m[1])


def check_league(specs: Sequence[str], plays_league: bool) -> None:
    """Raise ConfigError unless the league entries of ``specs`` can be played: well formed, a policy kind that plays
    them (the tiny model), and at least one entry that is not a league buyer (the warm start's opponents)."""
    from .config import ConfigError

    league = [s for s in specs if league_every(s) is not None]
    if not league:
        return
    if not plays_league:
        raise ConfigError(f"train_buyers: {league[0]!r}: league buyers are played by the tiny model only")
    if len(league) == len(specs):
        raise ConfigError(
            "train_buyers: a pool of league buyers only; add at least one other buyer (the warm start records "
            "its transcripts against those, before there is a policy to play the league)"
        )


class League:
    """The snapshots of one ``league:every=N`` entry: which one is current at a step, taken or loaded when due."""

    def __init__(self, every: int, directory: Path, tokenizer: Any) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self.directory = Path(directory)
        self.tokenizer = tokenizer
        self.version: int | None = None
        """The GRPO step whose policy the current snapshot is (None before the first refresh)."""
        self.model: Any = None

    def spec_at(self, version: int) -> str:
        return f"{LEAGUE}:every={self.every},at={version}"

    @property
    def spec(self) -> str | None:
        """The buyer spec of the current snapshot (None before the first refresh)."""
        return None if self.version is None else self.spec_at(self.version)

    def due(self, step: int) -> int:
        """The step of the snapshot that plays at ``step``: the last multiple of ``every`` up to it."""
        return step // self.every * self.every

    def refresh(self, policy: Any, step: int) -> bool:
        """Make the snapshot due at ``step`` current: ``policy`` itself when ``step`` is due (saved first), the saved
        one when a resumed run starts between refreshes. True if the snapshot changed."""
        due = self.due(step)
        if self.version == due:
            return False
        saved = self.directory / f"step-{due:06d}"
        if not (saved / "config.json").exists():
            if due != step:
                raise RuntimeError(
                    f"the league snapshot of step {due} is missing from {self.directory}; a run resumed at step "
                    f"{step} needs it (league:every={self.every})"
                )
            partial = saved.with_name(saved.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            policy.save_pretrained(partial)
            partial.rename(saved)  # whole or absent: a crash mid-save leaves only the .partial directory
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(saved)
        model.eval()
        model.requires_grad_(False)
        self.model, self.version = model, due
        return True

    def factory(self, temperature: float) -> CompactFactory:
        """Negotiators of the current snapshot under its versioned spec, sampling at ``temperature``."""
        if self.spec is None:
            raise RuntimeError("no league snapshot yet: call refresh first")
        return CompactFactory(self.spec, CompactPolicy(self.model, self.tokenizer), temperature)
