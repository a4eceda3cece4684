"""The conformance checker passes every built-in spec and catches agents that break the rules."""

from __future__ import annotations

import random

import pytest
from nego.agents.check import ConformanceError, check_negotiator
from nego.agents.registry import known_specs, resolve, rule_specs
from nego.market.types import Action, Observation
from nego.scenarios.scenario import Role

from ..conftest import make_widget_scenario
from .rules.test_rules import random_scenario

BUILT_IN = [s.replace("<e>", "0.5") for s in rule_specs()] + ["timedep:e=2,margin=0.1,patience=0.4"]


def test_rule_specs_lead_the_known_specs():
    assert known_specs()[: len(rule_specs())] == rule_specs()


@pytest.mark.parametrize("spec", BUILT_IN)
def test_every_built_in_spec_passes(spec):
    report = check_negotiator(spec)
    assert report.spec == resolve(spec).spec and report.negotiations == 3 * 2 * 2 * 5 and report.turns > 0


def test_check_accepts_explicit_scenarios_and_factories():
    report = check_negotiator(resolve("tft"), scenarios=[make_widget_scenario(), random_scenario(3)], seeds=(4,))
    assert report.negotiations == 2 * 2 * 5


class _Factory:
    def __init__(self, make, kind="rule"):
        self.make, self.kind, self.spec = make, kind, "test-agent"

    def __call__(self, role, seed):
        return self.make(seed)


class Greedy:
    """Offers its worst grid outcome: below its reservation value."""

    def __init__(self, seed):
        pass

    async def act(self, obs: Observation) -> Action:
        return Action.make_offer(
            {i.name: i.grid()[0] if obs.role is Role.SELLER else i.grid()[-1] for i in obs.scenario.issues}
        )


class Moody:
    """Uses the process-wide RNG, so a rerun with the same seed differs."""

    def __init__(self, seed):
        self.inner = resolve("random")(Role.SELLER, random.randrange(1 << 30))

    async def act(self, obs):
        return await self.inner.act(obs)


class Sloppy:
    """Offers a price out of range."""

    def __init__(self, seed):
        pass

    async def act(self, obs):
        return Action.make_offer({i.name: 10**6 for i in obs.scenario.issues})


SNOOPED: dict[str, float] = {}


class Snoop:
    """Reads the other side's reservation value from a side channel (a module-level dict) and uses it."""

    def __init__(self, seed):
        self.inner = resolve("linear")(Role.SELLER, seed)

    async def act(self, obs):
        if SNOOPED.get("rv", 0) > 0.5:
            return Action.walk_away()
        return await self.inner.act(obs)


@pytest.mark.parametrize(
    ("agent", "fragment"),
    [(Greedy, "below its reservation value"), (Moody, "rerun with the same seed"), (Sloppy, "invalid move")],
)
def test_rule_breakers_are_caught(agent, fragment):
    with pytest.raises(ConformanceError, match=fragment):
        check_negotiator(_Factory(agent), scenarios=[make_widget_scenario()], seeds=(0,))


def test_invalid_moves_are_tolerated_for_model_kinds_but_errors_are_not():
    check_negotiator(_Factory(Sloppy, kind="remote"), scenarios=[make_widget_scenario()], seeds=(0,))

    class Broken:
        def __init__(self, seed):
            pass

        async def act(self, obs):
            raise ConnectionError("backend down")

    with pytest.raises(ConformanceError, match="backend down"):
        check_negotiator(_Factory(Broken, kind="remote"), scenarios=[make_widget_scenario()], seeds=(0,))


def test_reading_the_other_sides_private_information_is_caught(monkeypatch):
    import nego.agents.check as check

    real = check._play

    async def leaky(scenario, role, me, other, seed, timeout_s):
        SNOOPED["rv"] = scenario.preferences(role.other).reservation
        return await real(scenario, role, me, other, seed, timeout_s)

    monkeypatch.setattr(check, "_play", leaky)
    with pytest.raises(ConformanceError, match="only the other side's private preferences changed"):
        check_negotiator(_Factory(Snoop), scenarios=[make_widget_scenario()], seeds=(0,))
