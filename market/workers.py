"""Worker processes for the marketplace: one market's negotiations played on several cores.

A :class:`WorkerPool` is started once per run and handed to a :class:`~nego.market.marketplace.Marketplace`
(``pool=``). The marketplace stays the one writer and the one publisher: it decides what to play (skipping what
the transcripts hold), sends chunks of jobs to the workers, and writes each result and publishes its events in
the parent process as the chunks come back. A worker only plays: it builds negotiators from the job specs with
the factories it was given (a picklable resolver such as ``functools.partial(resolve, settings=...)``: spec
strings and model settings are data) and returns each negotiation's result and wall time. Each job carries its
own seed, so a negotiation plays the same in a worker as in the parent.

The pool also maps pure functions over items (:meth:`WorkerPool.map`), which the population model uses to
generate a day's scenarios on the workers while it keeps the day's planning to itself.

Workers start with ``spawn``: the parent may already run threads (the pool's own, HTTP clients), and forking a
process with threads can deadlock it.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import pickle
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from nego.scenarios.scenario import Scenario

from .packing import PackedResult, pack_result, unpack_result
from .protocol import ProtocolConfig
from .settlement import check_tradeable
from .types import NegotiationResult

if TYPE_CHECKING:
    from .marketplace import FactorySource, Job, Marketplace, NegotiatorFactory

T = TypeVar("T")
R = TypeVar("R")

IN_PROCESS_KINDS = frozenset({"hf", "compact"})
"""Kinds of factories that play a model loaded in this process: every worker would load its own copy and the
calls could no longer be batched across the market, so they are refused with workers (serve the model instead)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """One negotiation a worker played: its result (packed for the trip, see :mod:`.packing`) and how long it took
    (wall seconds, in the worker)."""

    packed: PackedResult
    wall_s: float

    @property
    def result(self) -> NegotiationResult:
        return unpack_result(self.packed)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Jobs ``start`` to ``start + len(jobs)`` of a batch, on their way to one worker."""

    start: int
    jobs: tuple[Job, ...]


def check_workers_can_play(factories: Iterable[NegotiatorFactory]) -> None:
    """Raise ValueError naming the first factory that plays a model in this process (see :data:`IN_PROCESS_KINDS`)."""
    for factory in factories:
        if factory.kind in IN_PROCESS_KINDS:
            raise ValueError(
                f"{factory.spec} plays a model in this process ({factory.kind}), which worker processes cannot share: "
                "use --workers 1, or serve the model (vllm:MODEL@URL, remote:URL) and play it from the workers"
            )


def picklable(value: object) -> bool:
    """True if ``value`` can be sent to a worker process."""
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


class WorkerPool:
    """``workers`` processes that play jobs with ``factories``; kept for a whole run and closed with it.

    Use as a context manager (or call :meth:`close`). The processes start on first use.
    """

    def __init__(self, workers: int, factories: FactorySource) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        try:
            pickle.dumps(factories)
        except Exception as e:
            raise ValueError(
                "worker processes need factories they can rebuild: a mapping of picklable factories or a module-level "
                f"resolver (functools.partial(resolve, settings=...)), not {type(factories).__name__} ({e})"
            ) from None
        self.workers = workers
        self._executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=_context(),
            initializer=_start_worker,
            initargs=(factories,),
        )

    def play(
        self, jobs: Sequence[Job], protocol: ProtocolConfig, concurrency: int, per_kind: Mapping[str, int]
    ) -> list[tuple[Chunk, Future[list[Finished]]]]:
        """Send ``jobs`` to the workers in chunks; each chunk's future holds its results in job order.

        The caps are the market's: each worker plays under its share of them, so all workers together never
        exceed them (where a cap is at least the number of workers)."""
        share = max(1, concurrency // self.workers)
        kinds = {kind: max(1, cap // self.workers) for kind, cap in per_kind.items()}
        # chunks as large as a worker's share of the cap (so remote agents keep their requests in flight), but
        # at least one per worker, so that a small batch is still spread over them all
        size = max(1, min(share, math.ceil(len(jobs) / self.workers)))
        out = []
        for start in range(0, len(jobs), size):
            chunk = Chunk(start, tuple(jobs[start : start + size]))
            out.append((chunk, self._executor.submit(_play_chunk, chunk.jobs, protocol, share, kinds)))
        return out

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(x) for x in items]``, computed on the workers (``fn`` must be picklable: a module-level function or
        a ``functools.partial`` of one)."""
        if not items:
            return []
        size = max(1, math.ceil(len(items) / (self.workers * 4)))
        return list(self._executor.map(fn, items, chunksize=size))

    def close(self) -> None:
        """Stop the workers (what they still hold is closed on their way out); queued chunks are dropped."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _context() -> multiprocessing.context.BaseContext:
    """``forkserver`` where the platform has it (workers fork from a clean server that has imported the market
    once, so they start in milliseconds), else ``spawn``."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["nego.market.marketplace", "nego.market.workers"])
    return context


@dataclass
class _WorkerState:
    """What one worker process keeps between chunks: its factories, its event loop, and its marketplaces."""

    factories: FactorySource
    runner: asyncio.Runner
    markets: dict[tuple[ProtocolConfig, int, tuple[tuple[str, int], ...]], Marketplace]


_STATE: _WorkerState | None = None


def _start_worker(factories: FactorySource) -> None:
    global _STATE
    # one loop for the worker's life, as in the parent: async clients keep their connection pools between chunks
    _STATE = _WorkerState(factories, asyncio.Runner(), {})
    multiprocessing.util.Finalize(None, _stop_worker, exitpriority=10)
    parent = multiprocessing.parent_process()
    if parent is not None:  # a worker holds its own queue's write end, so it never sees EOF when the parent dies
        threading.Thread(target=_exit_with, args=(parent.sentinel,), name="parent-watch", daemon=True).start()


def _exit_with(sentinel: int) -> None:
    """Wait for the parent process to end (killed, even with SIGKILL), then end this worker: its results have
    nowhere to go."""
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def _stop_worker() -> None:
    state = _STATE
    if state is None:
        return
    try:
        for market in state.markets.values():
            state.runner.run(market.aclose())
    finally:
        state.runner.close()


def _play_chunk(
    jobs: tuple[Job, ...], protocol: ProtocolConfig, concurrency: int, per_kind: Mapping[str, int]
) -> list[Finished]:
    from .marketplace import Marketplace

    state = _STATE
    assert state is not None, "a worker plays only after _start_worker"
    key = (protocol, concurrency, tuple(sorted(per_kind.items())))
    market = state.markets.get(key)
    if market is None:
        market = Marketplace(state.factories, concurrency=concurrency, per_kind=per_kind, protocol=protocol)
        state.markets[key] = market
    played = state.runner.run(market.play(jobs))
    kept = next((p.job for p in played if p.seller_record is not None or p.buyer_record is not None), None)
    if kept is not None:  # a record lives in the worker's memory: a learner could never get it
        raise ValueError(
            f"{kept.seller} vs {kept.buyer}: a side keeps a record of its episode (a learner's), which a worker "
            "process cannot hand back; play it with workers=1"
        )
    return [Finished(pack_result(p.result), p.wall_s) for p in played]


def tradeable_scenario(source: Callable[[int], Scenario] | None, draw: int) -> Scenario:
    """Scenario ``draw`` of a generating source (None: the scenario generator), checked to be tradeable: what the
    population model has its workers make (here, so that a worker need not import the population model)."""
    if source is None:
        from nego.scenarios.generator import generate_scenario

        source = generate_scenario
    scenario = source(draw)
    check_tradeable(scenario)
    return scenario


def run_map(fn: Callable[..., Any], items: Sequence[Any], pool: WorkerPool | None) -> list[Any]:
    """``fn`` over ``items`` on ``pool``'s workers, or here without a pool (or when ``fn`` cannot be sent)."""
    if pool is None or len(items) < 2 or not picklable(fn):
        return [fn(x) for x in items]
    return pool.map(fn, items)
