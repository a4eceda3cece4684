"""Running a simulation: the agents, the learner, the transcripts and the population model a config describes.

A run reports to a :class:`SimulationObserver`: the learner's notes while it is set up, then the market's days,
which the observer watches through the run's :class:`~nego.market.events.EventBus` (a live view, progress lines,
or nothing). Rerunning a config on its directory resumes it: what is complete on disk is settled, not played.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

import polars as pl
from nego.market.events import EventBus
from nego.market.locks import exclusive_run
from nego.market.marketplace import NegotiatorFactory
from nego.market.protocol import ProtocolConfig
from nego.market.transcripts import TranscriptWriter, read_negotiations
from nego.market.workers import WorkerPool, check_workers_can_play

from .config import SimulateConfig
from .sources import load_scenario_source

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunStart:
    """What an observer is told as the market's days begin."""

    expected: int
    """Negotiations the market's days hold at most (days times pairs a day)."""
    settled: int
    """This run's negotiations already complete on disk: a resumed run settles them from its transcripts."""


class SimulationObserver(Protocol):
    """Whoever shows a simulation: gets the learner's notes, and watches the market's days through the bus."""

    def note(self, line: str) -> None:
        """A line for the user (what the learner is doing while it is set up or resumed)."""
        ...

    def watching(self, start: RunStart, bus: EventBus) -> AbstractContextManager[object]:
        """Entered around the market's days; subscribe to ``bus`` here."""
        ...


class _Quiet:
    """The observer of a run nobody watches: notes go to the log."""

    def note(self, line: str) -> None:
        logger.info("%s", line)

    def watching(self, start: RunStart, bus: EventBus) -> AbstractContextManager[object]:
        return contextlib.nullcontext()


@dataclass(frozen=True)
class SimulationResult:
    """A finished (or resumed) run: where its transcripts are, their latest negotiations, the market's days."""

    out_dir: Path
    negotiations: pl.DataFrame
    days: pl.DataFrame
    skipped: int
    """Negotiations already complete on disk when the run started."""
    registered: list[str] = field(default_factory=list)
    """Models the run's learners registered (``nego simulate --learn``)."""


def run_simulation(
    cfg: SimulateConfig, *, bus: EventBus | None = None, observer: SimulationObserver | None = None
) -> SimulationResult:
    """Run the market described by ``cfg``, writing transcripts to ``cfg.out_dir`` (resuming what is there);
    ``observer`` (default: nobody) is told how it goes."""
    from nego.agents.registry import resolve

    settings = cfg.model.settings()
    factories = {spec: resolve(spec, settings) for spec in {*cfg.sellers, *cfg.buyers}}  # fail fast on a bad spec
    if cfg.workers > 1:
        check_workers_can_play(factories.values())
    # workers resolve the same specs with the same settings; one pool serves every day of the run, and it starts
    # while the rest of the run is set up
    pool = WorkerPool(cfg.workers, partial(resolve, settings=settings)) if cfg.workers > 1 else None
    with pool or contextlib.nullcontext():
        return _run(cfg, factories, pool, bus or EventBus(), observer or _Quiet())


def _run(
    cfg: SimulateConfig,
    factories: dict[str, NegotiatorFactory],
    pool: WorkerPool | None,
    bus: EventBus,
    observer: SimulationObserver,
) -> SimulationResult:
    from nego.market.population import BuyerSetup, MarketModel, SellerSetup

    scenarios = load_scenario_source(cfg.scenarios) if cfg.scenarios else None
    sellers = [SellerSetup(cfg.sellers[i % len(cfg.sellers)], cfg.inventory) for i in range(cfg.negotiations)]
    n_buyers = cfg.negotiations + (cfg.learn_sellers if cfg.learn else 0)
    buyers = [BuyerSetup(cfg.buyers[i % len(cfg.buyers)], cfg.demand) for i in range(n_buyers)]
    with exclusive_run(cfg.out_dir, f"nego simulate --out {cfg.out_dir}"):
        learners = []
        if cfg.learn:
            learner = _learner(cfg, observer.note)
            learners.append(learner)
            sellers += [SellerSetup(learner.spec, cfg.inventory) for _ in range(cfg.learn_sellers)]
        writer = TranscriptWriter(cfg.out_dir, flush_every=256)
        skipped = len(writer.completed_ids())
        protocol = ProtocolConfig(max_retries=cfg.max_retries, turn_timeout_s=cfg.turn_timeout_s)
        model = MarketModel(
            factories,
            sellers,
            buyers,
            scenarios=scenarios,
            days=cfg.days,
            seed=cfg.seed,
            run_id=f"simulate-{cfg.seed}",
            concurrency=cfg.concurrency,
            per_kind=cfg.per_kind,
            protocol=protocol,
            bus=bus,
            writer=writer,
            learners=learners,
            pool=pool,
        )
        with model, writer:
            try:
                with observer.watching(RunStart(cfg.days * n_buyers, len(model.stored)), bus):
                    days = model.run()
            finally:
                model.run_coroutine(model.market.aclose())
        registered = [_register(learner, cfg) for learner in learners]
    negotiations = read_negotiations(cfg.out_dir, latest=True)
    return SimulationResult(cfg.out_dir, negotiations, days, skipped, [r for r in registered if r])


def _learner(cfg: SimulateConfig, note: Callable[[str], None]):
    """The learner ``--learn`` names, its state under the run directory (``learners/SPEC``)."""
    from nego.training.learners import learner_spec, make_learner

    assert cfg.learn is not None
    return make_learner(
        cfg.learn,
        cfg.out_dir / "learners" / learner_spec(cfg.learn),
        group_size=cfg.learn_group,
        groups_per_update=cfg.learn_batch,
        lr=cfg.learn_lr,
        seed=cfg.seed,
        threads=cfg.threads,
        echo=note,
    )


def _register(learner: object, cfg: SimulateConfig) -> str:
    """Register a GRPO learner's policy as ``SPEC-simSEED`` once it has been updated; '' if nothing to register."""
    register = getattr(learner, "register", None)
    if register is None or not getattr(learner, "policy_version", 0):
        return ""
    name = f"{learner.spec}-sim{cfg.seed}"  # type: ignore[attr-defined]
    register(name)
    return name
