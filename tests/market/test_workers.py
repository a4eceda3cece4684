"""Worker processes: the transcripts and events of one process, kill -9 and resume, and what they refuse to play."""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from nego.evaluation.config import EvalConfig
from nego.evaluation.runner import evaluate
from nego.market.events import EventBus, NegotiationEnded, NegotiationStarted, RunFinished, TurnPlayed
from nego.market.marketplace import Draft, Job, Marketplace
from nego.market.population import BuyerSetup, MarketModel, SellerSetup
from nego.market.transcript_rows import TIMING_COLUMNS
from nego.market.transcripts import TranscriptWriter, read_negotiations, read_turns
from nego.market.types import EndReason, NegotiationResult
from nego.market.workers import WorkerPool
from nego.scenarios.generator import generate_scenario
from nego.scenarios.scenario import Role, Scenario
from nego.simulation import SimulateConfig, run_simulation

from ..conftest import make_widget_scenario
from .fakes import Conceder, Factory
from .kill import run_killable
from .killable_run import make_jobs

ROOT = Path(__file__).resolve().parents[2]


class RecordingConceder(Conceder):
    """A side that keeps a record of its episode, as a learner does."""

    def record(self, result: NegotiationResult) -> int:
        return len(result.turns)


class RecordingFactory(Factory):
    def __call__(self, role: Role, seed: int) -> RecordingConceder:
        return RecordingConceder(seed)


SPECS = {
    "a": Factory("a"),
    "b": Factory("b", invalid_first=True, tokens=3),
    "slow": Factory("slow", delay=0.002),
    "local-model": Factory("local-model", kind="hf"),
    "recorder": RecordingFactory("recorder"),
}


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, SPECS) as pool:
        yield pool


def tables(directory: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Both transcript tables, sorted, without the columns that measure time."""
    neg = read_negotiations(directory).sort("negotiation_id", "attempt")
    turns = read_turns(directory).sort("negotiation_id", "attempt", "index")
    return tuple(t.drop([c for c in TIMING_COLUMNS if c in t.columns]) for t in (neg, turns))  # type: ignore[return-value]


def watched() -> tuple[EventBus, list[object]]:
    bus, seen = EventBus(), []
    bus.subscribe(seen.append)
    return bus, seen


def jobs_for(n: int) -> list[Job]:
    sc = make_widget_scenario()
    return [Job(sc, "slow" if i % 3 == 0 else "a", "b", seed=i, run_id="w", day=1, pair=i) for i in range(n)]


async def test_workers_return_results_in_job_order_and_publish_every_event(pool, tmp_path):
    jobs = jobs_for(30)
    events = {}
    results = {}
    for name, with_pool in (("here", None), ("workers", pool)):
        bus, seen = watched()
        with TranscriptWriter(tmp_path / name, flush_every=4) as writer:
            market = Marketplace(SPECS, concurrency=6, bus=bus, writer=writer, pool=with_pool)
            results[name] = await market.run(jobs)
        events[name] = seen
    assert results["workers"] == results["here"]  # job order, whatever finished first
    assert tables(tmp_path / "workers")[0].equals(tables(tmp_path / "here")[0])
    for kind in (NegotiationStarted, TurnPlayed, NegotiationEnded, RunFinished):
        assert sum(isinstance(e, kind) for e in events["workers"]) == sum(isinstance(e, kind) for e in events["here"])
    ended = [e for e in events["workers"] if isinstance(e, NegotiationEnded)]
    assert sorted(e.job.negotiation_id for e in ended) == sorted(j.negotiation_id for j in jobs)
    assert all(e.wall_s > 0 for e in ended)
    # every turn is published, with the standing offers of one process
    turns = {
        name: sorted(
            [(e.negotiation_id, e.turn, e.standing_seller) for e in seen if isinstance(e, TurnPlayed)], key=repr
        )
        for name, seen in events.items()
    }
    assert turns["workers"] == turns["here"]


async def test_a_rerun_on_workers_plays_only_what_is_missing(pool, tmp_path):
    jobs = jobs_for(12)
    with TranscriptWriter(tmp_path, flush_every=3) as writer:
        await Marketplace(SPECS, writer=writer, pool=pool).run(jobs[:5])
    bus, seen = watched()
    with TranscriptWriter(tmp_path, flush_every=3) as writer:
        results = await Marketplace(SPECS, writer=writer, pool=pool, bus=bus).run(jobs)
    finished = next(e for e in seen if isinstance(e, RunFinished))
    assert (finished.ran, finished.skipped) == (7, 5)
    assert read_negotiations(tmp_path).height == 12 and len(results) == 12


def made_in_a_worker(draw: int) -> Scenario:
    """The generator's scenario ``draw``, refused in the main process: a draft's scenario is made where it is played."""
    import multiprocessing

    if multiprocessing.parent_process() is None:
        raise AssertionError("a drafted scenario was made in the parent")
    return generate_scenario(draw)


def drafts_for(n: int) -> list[Draft]:
    return [Draft(1000 + i, "slow" if i % 3 == 0 else "a", "b", seed=i, run_id="d", day=2, pair=i) for i in range(n)]


async def test_drafts_are_made_and_played_on_the_workers_as_the_same_jobs_made_here(pool, tmp_path):
    drafts = drafts_for(24)
    jobs = [d.job(generate_scenario(d.draw)) for d in drafts]
    with TranscriptWriter(tmp_path / "here", flush_every=4) as writer:
        here = await Marketplace(SPECS, concurrency=6, writer=writer).play(jobs)
    bus, seen = watched()
    with TranscriptWriter(tmp_path / "drafted", flush_every=4) as writer:
        drafted = await Marketplace(SPECS, concurrency=6, writer=writer, pool=pool, bus=bus).play_drafts(
            made_in_a_worker, drafts
        )
    assert [p.job for p in drafted] == jobs  # the same jobs, ids included, in draft order
    assert [p.result for p in drafted] == [p.result for p in here]
    for a, b in zip(tables(tmp_path / "drafted"), tables(tmp_path / "here"), strict=True):
        assert a.equals(b)
    assert sum(isinstance(e, NegotiationEnded) for e in seen) == len(drafts)


async def test_a_rerun_of_drafts_on_workers_reads_back_what_is_complete(pool, tmp_path):
    drafts = drafts_for(12)
    with TranscriptWriter(tmp_path, flush_every=3) as writer:
        await Marketplace(SPECS, writer=writer).play([d.job(generate_scenario(d.draw)) for d in drafts[:5]])
    bus, seen = watched()
    with TranscriptWriter(tmp_path, flush_every=3) as writer:
        played = await Marketplace(SPECS, writer=writer, pool=pool, bus=bus).play_drafts(made_in_a_worker, drafts)
    finished = next(e for e in seen if isinstance(e, RunFinished))
    assert (finished.ran, finished.skipped) == (7, 5)
    assert [p.fresh for p in played] == [False] * 5 + [True] * 7
    assert read_negotiations(tmp_path).height == 12  # nothing written twice
    assert {p.job.negotiation_id for p in played} == set(read_negotiations(tmp_path)["negotiation_id"])


async def test_a_model_loaded_in_this_process_is_refused_before_anything_is_played(pool, tmp_path):
    job = Job(make_widget_scenario(), "local-model", "b", seed=1)
    with TranscriptWriter(tmp_path) as writer:
        market = Marketplace(SPECS, writer=writer, pool=pool)
        with pytest.raises(ValueError, match=r"local-model plays a model in this process.*--workers 1"):
            await market.run([job, *jobs_for(3)])
    assert read_negotiations(tmp_path).height == 0


async def test_a_side_that_keeps_a_record_is_refused_in_a_worker(pool):
    job = Job(make_widget_scenario(), "recorder", "b", seed=1)
    with pytest.raises(ValueError, match="keeps a record"):
        await Marketplace(SPECS, pool=pool).run([job])


async def test_api_agents_play_from_the_workers_with_the_parents_settings_and_environment(pool, tmp_path, monkeypatch):
    from nego.agents.llm.backends.limits import RetryPolicy
    from nego.agents.model_specs import LLMSettings
    from nego.agents.registry import resolve

    from ..fakes.llm_server import prompt_brain, serve

    key = "sk-workers-CANARY-5d21"
    assert list(pool.map(abs, [-1, -2])) == [1, 2]  # the workers' server runs: what is set now must still reach workers
    monkeypatch.setenv("OPENAI_API_KEY", key)
    plan = {"seller": [{"price": p, "quantity": 10, "warranty": "1y"} for p in (150, 130, 110)], "buyer": []}
    brain = prompt_brain(plan, {"seller": 0.6, "buyer": 0.55})
    async with serve(brain) as srv:
        settings = LLMSettings(base_url=srv.openai_url, policy=RetryPolicy(max_attempts=2, timeout_s=5.0))
        factories = functools.partial(resolve, settings=settings)
        jobs = [Job(make_widget_scenario(), "openai:seller-model", "conceder", seed=i) for i in range(6)]
        with WorkerPool(2, factories) as api_pool, TranscriptWriter(tmp_path) as writer:
            market = Marketplace(factories, writer=writer, pool=api_pool)
            there = await market.run(jobs)
            await market.aclose()
        here = await Marketplace(factories).run(jobs)
        requests = list(srv.requests)
    assert [r.outcome for r in there] == [r.outcome for r in here]
    assert all(r.outcome.end_reason is not EndReason.ERROR for r in there), [r.outcome.error for r in there]
    assert sum(r.usage_seller.calls for r in there + here) == len(requests)
    assert all(request.headers.get("Authorization") == f"Bearer {key}" for request in requests)


def test_factories_a_worker_cannot_rebuild_are_refused():
    with pytest.raises(ValueError, match="picklable"):
        WorkerPool(2, lambda spec: SPECS[spec])


def test_a_worker_plays_rule_agents_without_importing_polars_or_mesa():
    # what a worker process loads before its first chunk (the forkserver's preload) and while it plays: the
    # transcripts, summaries and the population model stay in the parent, so a pool starts without them
    code = (
        "import asyncio, sys\n"
        "from nego.agents.registry import resolve\n"
        "from nego.market import workers\n"
        "from nego.scenarios import generator\n"
        "job = workers.tradeable_scenario(None, 3)\n"
        "from nego.market.marketplace import Job, Marketplace\n"
        "[r] = asyncio.run(Marketplace(resolve).run([Job(job, 'tft', 'boulware', 0)]))\n"
        "assert r.outcome.turns > 0\n"
        "heavy = [m for m in ('polars', 'mesa', 'pandas') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_learners_are_refused_with_workers(pool):
    class Learner:
        spec, group_size = "learning", 1

        def resume(self) -> int:
            return 0

    with pytest.raises(ValueError, match="learners"):
        MarketModel(SPECS, [SellerSetup("a", 5)], [BuyerSetup("b", 5)], learners=[Learner()], pool=pool)  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"--learn .* --workers 1"):
        SimulateConfig(learn="tuner", workers=2)


@pytest.mark.parametrize("scenarios", [None, "builtin"], ids=["generated", "builtin"])
def test_a_simulation_on_two_workers_writes_the_transcripts_of_one_process(tmp_path, scenarios):
    base = SimulateConfig(days=3, negotiations=10, seed=11, scenarios=scenarios, out=tmp_path / "one")
    one = run_simulation(base)
    two = run_simulation(replace(base, workers=2, out=tmp_path / "two"))
    assert one.negotiations.height == two.negotiations.height >= 20
    for a, b in zip(tables(tmp_path / "one"), tables(tmp_path / "two"), strict=True):
        assert a.equals(b)
    assert one.days.equals(two.days)  # the same deals settled in the same order


def test_an_evaluation_on_two_workers_writes_the_transcripts_and_statistics_of_one_process(tmp_path, monkeypatch):
    base = EvalConfig(sellers=("boulware", "linear"), suite="eval-dev", out=tmp_path / "one", resamples=1000)
    one = evaluate(base)

    def not_here(*args, **kwargs):
        raise AssertionError("an optimality gap was replayed in the parent")

    # the workers find the gaps (replaying each negotiation many times): this process never replays one
    monkeypatch.setattr("nego.evaluation.runner.best_response_value", not_here)
    two = evaluate(replace(base, workers=2, out=tmp_path / "two"))
    assert one.played == two.played > 0
    assert two.metrics["optimality_gap"].drop_nulls().len() > 0
    for a, b in zip(tables(tmp_path / "one" / "transcripts"), tables(tmp_path / "two" / "transcripts"), strict=True):
        assert a.equals(b)
    timing = [c for c in TIMING_COLUMNS if c in one.metrics.columns]
    assert one.metrics.drop(timing).equals(two.metrics.drop(timing))
    assert one.comparisons.equals(two.comparisons)


def _gone(pid: int, within: float = 10.0) -> bool:
    """True once process ``pid`` has ended (a zombie counts as ended) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        except OSError:
            state = "?"
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _run_killable(directory: Path, n: int, fail: bool, kill_at: int | None, pause: float = 0.0) -> bool:
    """The killable run on two workers; with ``kill_at``, SIGKILLed ``pause`` s after its ``kill_at``-th finished
    negotiation, and its workers must end on their own. True if it was killed before it finished."""
    killed, [workers] = run_killable([str(directory), str(n), "1" if fail else "0", "2"], kill_at, pause, header=1)
    pids = workers.split()
    assert pids[0] == "workers" and len(pids) == 3, pids
    if killed:
        assert all(_gone(int(pid)) for pid in pids[1:]), "a worker outlived its killed parent"
    return killed


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_killed_runs_on_workers_resume_to_exactly_the_rows_of_an_uninterrupted_run(tmp_path):
    n = 60
    rng = random.Random(20240612)
    directory = tmp_path / "killed"
    killed = [
        _run_killable(directory, n, fail, kill_at=rng.randint(2, 14), pause=rng.uniform(0.0, 0.02))
        for fail in (True, False, False)
    ]
    assert sum(killed) >= 2
    _run_killable(directory, n, False, kill_at=None)
    reference = tmp_path / "reference"
    _run_killable(reference, n, False, kill_at=None)

    all_rows = read_negotiations(directory)
    assert all_rows.select("negotiation_id", "attempt").is_duplicated().sum() == 0
    assert all_rows.filter(pl.col("end_reason") != "error").height == n
    assert read_turns(directory).select("negotiation_id", "attempt", "index").is_duplicated().sum() == 0
    latest = read_negotiations(directory, latest=True)
    assert set(latest["negotiation_id"]) == {j.negotiation_id for j in make_jobs(n)}
    drop = ["attempt", *TIMING_COLUMNS]
    ref_neg, ref_turns = read_negotiations(reference), read_turns(reference)
    assert (
        latest.drop(drop, strict=False)
        .sort("negotiation_id")
        .equals(ref_neg.drop(drop, strict=False).sort("negotiation_id"))
    )
    assert (
        read_turns(directory, latest=True)
        .drop(drop, strict=False)
        .sort("negotiation_id", "index")
        .equals(ref_turns.drop(drop, strict=False).sort("negotiation_id", "index"))
    )


def _simulate(out: Path, workers: int, kill_after_day: int | None = None) -> bool:
    """``nego simulate`` of 12 days in a subprocess; with ``kill_after_day``, SIGKILLed once that day's line is out.
    True if it was killed before it finished."""
    args = ["simulate", "--no-live", "--out", str(out), "--days", "12", "--negotiations", "8", "--seed", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "nego.cli.app", *args, "--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if kill_after_day is not None and line.startswith(f"day {kill_after_day}:"):
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
        assert proc.wait(timeout=120) == 0
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_simulation_on_workers_resumes_to_the_transcripts_of_an_uninterrupted_one(tmp_path):
    assert _simulate(tmp_path / "killed", 2, kill_after_day=3)
    stored = read_negotiations(tmp_path / "killed").height
    assert 0 < stored < 96
    assert not _simulate(tmp_path / "killed", 2)
    assert not _simulate(tmp_path / "reference", 1)
    for a, b in zip(tables(tmp_path / "killed"), tables(tmp_path / "reference"), strict=True):
        assert a.drop("attempt").equals(b.drop("attempt"))
