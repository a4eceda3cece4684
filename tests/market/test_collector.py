"""The collector is paced during a market run and left as it was after it."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass

import pytest
from nego.market.collector import RUN_THRESHOLD, paced_collection
from nego.market.marketplace import Job, Marketplace

from ..conftest import make_widget_scenario
from .fakes import Conceder


@pytest.fixture
def default_collector():
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    yield
    gc.set_threshold(*before)
    (gc.enable if enabled else gc.disable)()


def test_a_run_raises_the_youngest_threshold_and_restores_it(default_collector):
    seen = []

    class Watching(Conceder):
        async def act(self, obs):
            seen.append(gc.get_threshold())
            return await super().act(obs)

    @dataclass
    class WatchingFactory:
        spec: str
        kind: str = "rule"

        def __call__(self, role, seed):
            return Watching(seed)

    jobs = [Job(make_widget_scenario(), "a", "b", s) for s in range(3)]
    asyncio.run(Marketplace({"a": WatchingFactory("a"), "b": WatchingFactory("b")}).run(jobs))
    assert seen and set(seen) == {(RUN_THRESHOLD, 10, 10)}
    assert gc.get_threshold() == (700, 10, 10)


def test_pacing_leaves_a_higher_threshold_a_disabled_collector_and_errors_alone(default_collector):
    with paced_collection(), paced_collection():
        assert gc.get_threshold() == (RUN_THRESHOLD, 10, 10)
    gc.set_threshold(10**6, 10, 10)
    with paced_collection():
        assert gc.get_threshold()[0] == 10**6
    gc.set_threshold(700, 10, 10)
    gc.disable()
    with paced_collection():
        assert gc.get_threshold()[0] == 700 and not gc.isenabled()
    gc.enable()
    with pytest.raises(RuntimeError), paced_collection():
        raise RuntimeError("a failing run")
    assert gc.get_threshold() == (700, 10, 10)
