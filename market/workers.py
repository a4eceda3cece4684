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

Workers start from a ``forkserver`` (``spawn`` where there is none), never by forking the parent: it may already run
threads (the pool's own, HTTP clients), and forking a process with threads can deadlock it. A script that makes a
pool must guard its entry point with ``if __name__ == "__main__":``, as for any such pool.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import pickle
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from nego.scenarios.scenario import Scenario

from .packing import pack_result, unpack_result
from .protocol import ProtocolConfig
from .settlement import check_tradeable
from .types import NegotiationResult

if TYPE_CHECKING:
    from .marketplace import Draft, FactorySource, Job, Marketplace, NegotiatorFactory, Played

T = TypeVar("T")
R = TypeVar("R")

IN_PROCESS_KINDS = frozenset({"hf", "compact"})
"""Kinds of factories that play a model loaded in this process: every worker would load its own copy and the
calls could no longer be batched across the market, so they are refused with workers (serve the model instead)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """One negotiation a worker played: its result and how long it took (wall seconds, in the worker)."""

    result: NegotiationResult
    wall_s: float


@dataclass(frozen=True, slots=True)
class Chunk:
    """Jobs (or drafts of jobs) ``start`` to ``start + len(jobs)`` of a batch, on their way to one worker."""

    start: int
    jobs: tuple[Job, ...] | tuple[Draft, ...]


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

    Use as a context manager (or call :meth:`close`). The processes start at once, in the background, so that they
    start while the caller sets up the rest of its run.
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
            mp_context=_context(factories),
            initializer=_start_worker,
            # a forkserver's children inherit its environment, not this process's as it is now
            initargs=(factories, dict(os.environ)),
        )
        self._starting = threading.Thread(target=self._start, name="worker-start", daemon=True)
        self._starting.start()

    def _start(self) -> None:
        for future in [self._executor.submit(_ready) for _ in range(self.workers)]:
            future.exception()  # a worker that cannot start breaks the pool: the first chunk sent to it says so

    def play(
        self,
        jobs: Sequence[Job],
        protocol: ProtocolConfig,
        concurrency: int,
        per_kind: Mapping[str, int],
        *,
        waiting: bool = False,
    ) -> list[tuple[Chunk, Future[bytes]]]:
        """Send ``jobs`` to the workers in chunks; each chunk's future holds its results in job order, to be read with
        :func:`finished`. ``waiting``: the negotiations mostly wait (on a server, an API) rather than compute.

        The caps are the market's: each worker plays under its share of them, so all workers together never
        exceed them (where a cap is at least the number of workers)."""
        return self._send(_play_chunk, (), jobs, protocol, concurrency, per_kind, waiting)

    def play_drafts(
        self,
        source: Callable[[int], Scenario] | None,
        drafts: Sequence[Draft],
        protocol: ProtocolConfig,
        concurrency: int,
        per_kind: Mapping[str, int],
        *,
        waiting: bool = False,
    ) -> list[tuple[Chunk, Future[bytes]]]:
        """:meth:`play` of the jobs ``drafts`` become, each worker making the scenarios of its chunk from their draws
        (``tradeable_scenario(source, draw)``) before it plays them; read each chunk's future with :func:`drafted`."""
        return self._send(_play_drafts_chunk, (source,), drafts, protocol, concurrency, per_kind, waiting)

    def _send(
        self,
        fn: Callable[..., bytes],
        head: tuple[Any, ...],
        items: Sequence[Any],
        protocol: ProtocolConfig,
        concurrency: int,
        per_kind: Mapping[str, int],
        waiting: bool,
    ) -> list[tuple[Chunk, Future[bytes]]]:
        share = max(1, concurrency // self.workers)
        kinds = {kind: max(1, cap // self.workers) for kind, cap in per_kind.items()}
        # a worker plays one chunk at a time: negotiations that wait go in chunks as large as its share of the cap,
        # so that as many are in flight as in one process; negotiations that compute go in a few chunks per
        # worker, so that one chunk's results are written while the next chunks are played
        spread = 1 if waiting else 8
        size = max(1, min(share, math.ceil(len(items) / (self.workers * spread))))
        out = []
        for start in range(0, len(items), size):
            chunk = Chunk(start, tuple(items[start : start + size]))
            out.append((chunk, self._executor.submit(fn, *head, chunk.jobs, protocol, share, kinds)))
        return out

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """``fn(x) for x in items``, in order, computed on the workers (``fn`` must be picklable: a module-level
        function or a ``functools.partial`` of one). The values come as their chunks do: the caller can use the
        first ones while the workers make the rest."""
        size = max(1, math.ceil(len(items) / (self.workers * 8)))
        chunks = [tuple(items[i : i + size]) for i in range(0, len(items), size)]
        futures = [self._executor.submit(_map_chunk, fn, chunk) for chunk in chunks]
        try:
            for future in futures:
                yield from _loads(future.result())
        finally:
            for future in futures:  # the caller stopped early, or a chunk failed
                future.cancel()

    def close(self) -> None:
        """Stop the workers (what they still hold is closed on their way out); queued chunks are dropped."""
        self._starting.join()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _context(factories: FactorySource) -> multiprocessing.context.BaseContext:
    """``forkserver`` where the platform has it (workers fork from a clean server that has imported the market, the
    scenario generator and the factories' modules once, so they start in milliseconds), else ``spawn``."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    main = getattr(sys.modules["__main__"], "__spec__", None)  # a worker imports a `python -m` main module again
    mains = [main.name] if main is not None and not main.name.endswith("__main__") else []
    context.set_forkserver_preload([__name__, "nego.scenarios.generator", *_modules_of(factories), *mains])
    return context


def _modules_of(factories: FactorySource) -> list[str]:
    """The modules a worker imports to rebuild ``factories``: the resolver's, or each factory's."""
    source = factories.func if isinstance(factories, functools.partial) else factories
    found = (type(f) for f in source.values()) if isinstance(source, Mapping) else (source,)
    return sorted({m for m in (getattr(f, "__module__", None) for f in found) if m and m != "__main__"})


@dataclass
class _WorkerState:
    """What one worker process keeps between chunks: its factories, its event loop, and its marketplaces."""

    factories: FactorySource
    runner: asyncio.Runner
    markets: dict[tuple[ProtocolConfig, int, tuple[tuple[str, int], ...]], Marketplace]


_STATE: _WorkerState | None = None


def _start_worker(factories: FactorySource, environ: dict[str, str]) -> None:
    global _STATE
    os.environ.clear()
    os.environ.update(environ)  # credentials, NEGO_HOME, ...: what the parent's own factories were built with
    # one loop for the worker's life, as in the parent: async clients keep their connection pools between chunks
    _STATE = _WorkerState(factories, asyncio.Runner(), {})
    multiprocessing.util.Finalize(None, _stop_worker, exitpriority=10)
    # this process only plays: what it has imported stays out of every collection, and the collector runs less
    # often (a negotiation makes thousands of short-lived objects, hardly any of them cyclic)
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
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


def finished(data: bytes) -> list[Finished]:
    """The results of a chunk sent by :meth:`WorkerPool.play`, in job order."""
    with _gc_paused():
        return [Finished(unpack_result(packed), wall) for packed, wall in pickle.loads(data)]


def drafted(data: bytes) -> list[tuple[Scenario, Finished]]:
    """The scenarios made and the results of a chunk sent by :meth:`WorkerPool.play_drafts`, in draft order."""
    with _gc_paused():
        return [(scenario, Finished(unpack_result(packed), wall)) for scenario, packed, wall in pickle.loads(data)]


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused: unpickling a chunk makes thousands of small acyclic objects, and the
    collections they would trigger on the way walk a heap that holds nothing to collect."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _loads(data: bytes) -> Any:
    with _gc_paused():
        return pickle.loads(data)


def _dumps(value: object) -> bytes:
    # a worker pickles what it sends, so that the parent unpickles it in _loads, not in the pool's result thread
    with _gc_paused():
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _ready() -> None:
    """Nothing: sent once per worker so that every process starts."""


def _map_chunk(fn: Callable[[T], R], items: tuple[T, ...]) -> bytes:
    return _dumps([fn(x) for x in items])


def _play_chunk(
    jobs: tuple[Job, ...], protocol: ProtocolConfig, concurrency: int, per_kind: Mapping[str, int]
) -> bytes:
    played = _play(jobs, protocol, concurrency, per_kind)
    return _dumps([(pack_result(p.result), p.wall_s) for p in played])


def _play_drafts_chunk(
    source: Callable[[int], Scenario] | None,
    drafts: tuple[Draft, ...],
    protocol: ProtocolConfig,
    concurrency: int,
    per_kind: Mapping[str, int],
) -> bytes:
    scenarios = [tradeable_scenario(source, d.draw) for d in drafts]
    played = _play(tuple(d.job(sc) for d, sc in zip(drafts, scenarios, strict=True)), protocol, concurrency, per_kind)
    return _dumps([(sc, pack_result(p.result), p.wall_s) for sc, p in zip(scenarios, played, strict=True)])


def _play(
    jobs: tuple[Job, ...], protocol: ProtocolConfig, concurrency: int, per_kind: Mapping[str, int]
) -> list[Played]:
    from .marketplace import Marketplace

    state = _STATE
    assert state is not None, "a worker plays only after _start_worker"
    key = (protocol, concurrency, tuple(sorted(per_kind.items())))
    market = state.markets.get(key)
    if market is None:
        market = Marketplace(state.factories, concurrency=concurrency, per_kind=per_kind, protocol=protocol)
        state.markets[key] = market
    played: list[Played] = []
    state.runner.run(_play_into(played, market, jobs))
    return played


async def _play_into(played: list[Played], market: Marketplace, jobs: tuple[Job, ...]) -> None:
    """Play the jobs into ``played``. The run's main task returns nothing: as ``asyncio.Runner.run`` restores the
    SIGINT handler it formats that task, result included, and a list of results formats every turn of several."""
    played.extend(await market.play(jobs))
    kept = next((p.job for p in played if p.seller_record is not None or p.buyer_record is not None), None)
    if kept is not None:  # a record lives in the worker's memory: a learner could never get it
        raise ValueError(
            f"{kept.seller} vs {kept.buyer}: a side keeps a record of its episode (a learner's), which a worker "
            "process cannot hand back; play it with workers=1"
        )


def tradeable_scenario(source: Callable[[int], Scenario] | None, draw: int) -> Scenario:
    """Scenario ``draw`` of a generating source (None: the scenario generator), checked to be tradeable: what the
    population model has its workers make (here, so that a worker need not import the population model)."""
    if source is None:
        from nego.scenarios.generator import generate_scenario

        source = generate_scenario
    scenario = source(draw)
    check_tradeable(scenario)
    scenario.content_hash()  # kept by the scenario: the parent names its jobs by it without computing it again
    return scenario


def run_map(fn: Callable[..., Any], items: Sequence[Any], pool: WorkerPool | None) -> Iterator[Any]:
    """``fn`` over ``items``, in order: on ``pool``'s workers, or here without a pool (or when ``fn`` cannot be
    sent), one at a time as the caller asks."""
    if pool is None or len(items) < 2 or not picklable(fn):
        return (fn(x) for x in items)
    return pool.map(fn, items)
