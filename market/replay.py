"""Replaying what a population run already did: its stored days and its learners' restored state.

Resuming with a writer: the negotiations of this run already completed on disk are read once per run
(:class:`StoredSlots`), and a pair whose slot (day, pair, seller, buyer, seed and scenario) is among them is settled
from its stored outcome without building its job, so a finished run neither plays nor regenerates anything. With
learners, the days after the last one every learner learned from are first dropped from the transcripts
(:func:`resume_learners`): they are played again, by the restored policies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from .learning import Learner
    from .population import ScenarioSource
    from .transcripts import TranscriptWriter
    from .types import Outcome

logger = logging.getLogger(__name__)


def resume_learners(learners: Iterable[Learner], writer: TranscriptWriter | None) -> int:
    """The last day every learner has learned from (0 without learners), after rolling the transcripts of later days
    back: what a killed run played after its learners' last saved state is played again."""
    learners = list(learners)
    if not learners:
        return 0
    done = min(learner.resume() for learner in learners)
    if writer is not None:
        writer.rollback(pl.col("day") > done, f"of days after day {done}, the last day every learner learned from")
    return done


class StoredSlots:
    """The completed negotiations of one run, by slot, as a resumed :class:`MarketModel` reads them (once).

    A stored negotiation stands for a pair only if everything that defines it matches: day, pair, seller and
    buyer specs, seed, and the scenario. A scenario from a list is compared by content hash. A generated scenario
    is matched by the recipe in its id (the draw is its generator seed), once the generator has been checked to
    still make, for one stored draw, the very scenario that was played; any other scenario source is played
    through the marketplace, which skips what is done by negotiation id.
    """

    def __init__(self, rows: pl.DataFrame | None) -> None:
        cols = ("day", "pair", "seller", "buyer", "seed")
        self._rows: dict[tuple, dict[str, Any]] = {}
        if rows is not None:
            self._rows = {tuple(r[c] for c in cols): r for r in rows.iter_rows(named=True)}
        self._generator_ok: bool | None = None

    @classmethod
    def read(cls, writer: TranscriptWriter | None, run_id: str) -> StoredSlots:
        """The slots of run ``run_id`` complete in ``writer``'s directory (none without a writer)."""
        return cls(writer.completed_rows(run_id) if writer is not None else None)

    def __len__(self) -> int:
        return len(self._rows)

    def outcome(
        self, day: int, pair: int, seller: str, buyer: str, seed: int, draw: int, source: ScenarioSource | None
    ) -> Outcome | None:
        """The stored outcome of this slot, or None if it has to be played."""
        row = self._rows.get((day, pair, seller, buyer, seed))
        if row is None or not self._same_scenario(row, draw, source):
            return None
        from .transcript_rows import outcome_from_row

        return outcome_from_row(row)

    def _same_scenario(self, row: dict[str, Any], draw: int, source: ScenarioSource | None) -> bool:
        from .marketplace import scenario_hash

        if source is not None:
            return not callable(source) and scenario_hash(source[draw]) == row["scenario_hash"]
        from nego.scenarios.generator import GeneratedId, generate_scenario

        recipe = GeneratedId.parse(row["scenario_id"])
        if recipe is None or (recipe.seed, recipe.index, recipe.opposition, recipe.zopa) != (draw, 0, None, True):
            return False
        if self._generator_ok is None:
            self._generator_ok = scenario_hash(generate_scenario(draw)) == row["scenario_hash"]
            if not self._generator_ok:
                logger.warning(
                    "the scenario generator no longer makes the scenarios this run played (draw %d): stored "
                    "negotiations are not reused and every pair is played again",
                    draw,
                )
        return self._generator_ok
