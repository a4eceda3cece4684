"""Agents and scenario sources from other packages: a tiny distribution is written into tmp_path and put on sys.path,
then resolved by entry point and by ``py:`` path, played through the market, checked and listed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.agents import plugins
from nego.agents.check import ConformanceError, check_negotiator
from nego.agents.plugins import PluginError, ScenarioSourceError, format_value, load_scenario_source, parse_value
from nego.agents.registry import UnknownSpecError, builtin_form, known_specs, resolve
from nego.cli.app import app
from nego.market.marketplace import Job, Marketplace
from nego.market.transcripts import TranscriptWriter, read_negotiations, read_turns
from nego.market.types import EndReason
from nego.scenarios.scenario import Role, Scenario
from typer.testing import CliRunner

from ..conftest import make_widget_scenario

runner = CliRunner()
PKG = "nego_plugin_testpkg"

BOTS = '''
import random
from dataclasses import replace

from nego import Action, Observation, Role
from nego.scenarios.generator import generate_scenario


class MyBot:
    """Accepts anything worth its reservation plus `aggr`; else offers a random outcome it likes that much."""

    def __init__(self, role: Role, seed: int, aggr: float = 0.3, k: int = 1) -> None:
        if aggr >= 1:
            raise ValueError(f"aggr must be below 1, got {aggr}")
        self.role, self.rng, self.aggr, self.k = role, random.Random(seed), aggr, k

    async def act(self, obs: Observation) -> Action:
        me = obs.scenario
        floor = min(me.preferences.reservation + self.aggr, 0.95)
        if obs.standing_offer is not None and me.utility(obs.standing_offer) >= floor:
            return Action.accept()
        best = None
        for _ in range(20 * self.k):
            offer = {i.name: self.rng.choice(i.grid()) for i in me.issues}
            if best is None or me.utility(offer) > me.utility(best):
                best = offer
            if me.utility(offer) >= floor:
                return Action.make_offer(offer)
        return Action.make_offer(best)


class Loose:
    """Takes any keyword parameter."""

    def __init__(self, role, seed, **options):
        self.inner, self.options = MyBot(role, seed), options

    async def act(self, obs):
        return await self.inner.act(obs)


def make_bot(role, seed, style="calm"):
    return MyBot(role, seed, aggr=0.1 if style == "calm" else 0.4)


class NoRole:
    def __init__(self, seed):
        pass

    async def act(self, obs):
        return Action.walk_away()


class SyncAct:
    def __init__(self, role, seed):
        pass

    def act(self, obs):
        return Action.walk_away()


class NoAct:
    def __init__(self, role, seed):
        pass


class Sloppy:
    """Offers values out of range: an invalid move every turn."""

    def __init__(self, role, seed):
        pass

    async def act(self, obs):
        return Action.make_offer({i.name: 10**6 for i in obs.scenario.issues})


class Leaky:
    """Writes the environment's OpenAI key into its message, and raises with it once told no."""

    def __init__(self, role: Role, seed: int) -> None:
        self.role = role

    async def act(self, obs: Observation) -> Action:
        import os

        key = os.environ.get("OPENAI_API_KEY", "")
        if obs.standing_offer is not None:
            raise RuntimeError(f"backend refused key {key}")
        return Action.make_offer({i.name: i.grid()[0] for i in obs.scenario.issues}, message=f"my key is {key}")


NOT_CALLABLE = 42


def seeded(seed):
    return replace(generate_scenario(seed, max_rounds=6), id=f"plugin-shop-{seed}")


def fixed():
    return [generate_scenario(s, max_rounds=6) for s in (1, 2, 3)]


def empty():
    return []


def not_a_scenario(seed):
    return "scenario"
'''

ENTRY_POINTS = f"""
[nego.agents]
mybot = {PKG}.bots:MyBot
loose = {PKG}.bots:Loose
brokenbot = {PKG}.nowhere:Bot
missingattr = {PKG}.bots:Nobody
tft = {PKG}.bots:MyBot
openai = {PKG}.bots:MyBot

[nego.scenarios]
shop = {PKG}.bots:seeded
shoplist = {PKG}.bots:fixed
emptyshop = {PKG}.bots:empty
"""


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """An installed distribution ``nego-plugin-testpkg`` that declares agents and scenario sources."""
    pkg = tmp_path / PKG
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bots.py").write_text(BOTS)
    info = tmp_path / f"{PKG}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nego-plugin-testpkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.clear_cache()
    yield tmp_path
    for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
        del sys.modules[name]
    monkeypatch.undo()
    plugins.clear_cache()


def test_an_entry_point_resolves_with_parameters_and_a_canonical_spec(plugin_dist):
    factory = resolve("mybot:k=2")
    assert factory.spec == "mybot:k=2" and factory.kind == "plugin"
    assert factory.target == f"{PKG}.bots:MyBot"
    agent = factory(Role.BUYER, 7)
    assert type(agent).__name__ == "MyBot" and agent.k == 2 and isinstance(agent.k, int) and agent.role is Role.BUYER
    assert resolve("mybot:aggr=0.25, k=3").spec == "mybot:aggr=0.25,k=3"
    assert resolve("mybot:k=3,aggr=0.25") == resolve("mybot:aggr=0.25,k=3")
    assert resolve("mybot:k=1").spec == "mybot" == resolve("MyBot").spec  # a default is not part of the name


def test_a_plugin_agent_plays_through_the_marketplace_deterministically(plugin_dist):
    scenario = make_widget_scenario(max_rounds=8)
    jobs = [Job(scenario, "mybot:k=2", "linear", seed) for seed in range(4)] + [
        Job(scenario, "boulware", "py:" + PKG + ".bots:MyBot:aggr=0.1", 9)
    ]

    async def play():
        return await Marketplace(resolve).run(jobs)

    first, again = asyncio.run(play()), asyncio.run(play())
    assert all(r.outcome.end_reason is not EndReason.ERROR for r in first)
    assert all(r.outcome.turns > 0 for r in first)
    assert [r.outcome for r in first] == [r.outcome for r in again]


def test_a_plugin_agent_cannot_leak_a_credential_into_the_transcript(plugin_dist, monkeypatch, tmp_path):
    key = "sk-test-abcdefghijklmnop"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    scenario = make_widget_scenario(max_rounds=4)
    jobs = [Job(scenario, f"py:{PKG}.bots:Leaky", "linear", 0), Job(scenario, "linear", f"py:{PKG}.bots:Leaky", 1)]

    async def play():
        market = Marketplace(resolve, writer=TranscriptWriter(tmp_path))
        try:
            return await market.run(jobs)
        finally:
            await market.aclose()

    results = asyncio.run(play())
    messages = [t.action.message for r in results for t in r.turns if t.action.message]
    errors = [r.outcome.error for r in results if r.outcome.error]
    assert messages and all(m == "my key is [redacted:OPENAI_API_KEY]" for m in messages)
    assert errors and all("[redacted:OPENAI_API_KEY]" in e and "RuntimeError" in e for e in errors)
    stored = str(read_turns(tmp_path).to_dicts()) + str(read_negotiations(tmp_path).to_dicts())
    assert key not in stored and "[redacted:OPENAI_API_KEY]" in stored


def test_without_credentials_a_plugin_agent_is_played_as_it_is_built(plugin_dist, monkeypatch):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "VLLM_API_KEY", "NEGO_AGENT_TOKEN", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    agent = resolve(f"py:{PKG}.bots:Leaky")(Role.SELLER, 0)
    assert type(agent).__name__ == "Leaky"


def test_check_negotiator_passes_a_plugin_agent(plugin_dist):
    report = check_negotiator("mybot:k=2", seeds=(0,))
    assert report.kind == "plugin" and report.spec == "mybot:k=2" and report.negotiations == 3 * 2 * 5


def test_check_negotiator_requires_valid_moves_of_plugin_agents(plugin_dist):
    with pytest.raises(ConformanceError, match="invalid move"):
        check_negotiator(f"py:{PKG}.bots:Sloppy", scenarios=[make_widget_scenario()], seeds=(0,))


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ("mybot:x=1", ["'mybot:x=1'", f"{PKG}.bots:MyBot", "unknown parameter 'x'", "accepted: aggr, k"]),
        ("mybot:aggr=2", ["building a seller with seed 0 raised ValueError", "aggr must be below 1"]),
        ("mybot:seed=3", ["seed is given by nego"]),
        ("mybot:k", ["key=value"]),
        ("mybot:k=1e999", ["k:", "not a usable number"]),
        ("brokenbot", ["plugin agent 'brokenbot'", "cannot be loaded", f"no module named '{PKG}.nowhere'"]),
        ("missingattr", ["cannot be loaded", "has no attribute 'Nobody'"]),
        ("openai", ["shadowed by the built-in spec openai:<model>", f"py:{PKG}.bots:MyBot"]),
        ("py:no_such_module_xyz:Bot", ["'py:no_such_module_xyz:Bot'", "no module named 'no_such_module_xyz'"]),
        (f"py:{PKG}.bots:Nobody", [f"{PKG}.bots has no attribute 'Nobody'"]),
        (f"py:{PKG}.bots:NOT_CALLABLE", ["a int object, not a class or a callable"]),
        (f"py:{PKG}.bots:NoRole", ["must accept the keyword arguments role and seed"]),
        (f"py:{PKG}.bots:SyncAct", ["SyncAct.act must be async"]),
        (f"py:{PKG}.bots:NoAct", ["without an act method"]),
        (f"py:{PKG}.bots:make_bot:mood=1", ["unknown parameter 'mood'", "accepted: style"]),
        (f"py:{PKG}.bots", ["write py:<module>:<attr>"]),
        ("py:", ["write py:<module>:<attr>"]),
        ("nosuchbot", ["unknown negotiator spec 'nosuchbot'", "py:<module>:<attr>", "plugin agents:", "mybot"]),
    ],
)
def test_bad_plugin_specs_fail_in_resolve_with_clear_messages(plugin_dist, spec, fragments):
    with pytest.raises(UnknownSpecError) as err:
        resolve(spec)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_py_specs_take_parameters_and_any_callable(plugin_dist):
    factory = resolve(f"py:{PKG}.bots:MyBot:k=2,aggr=0.2")
    assert factory.spec == f"py:{PKG}.bots:MyBot:aggr=0.2,k=2" and factory.kind == "plugin"
    assert resolve(f"py:{PKG}.bots:MyBot:aggr=0.3").spec == f"py:{PKG}.bots:MyBot"
    assert resolve(f"py:{PKG}.bots:make_bot:style=bold")(Role.SELLER, 1).aggr == 0.4
    loose = resolve("loose:zeta=x,alpha=2")
    assert loose.spec == "loose:alpha=2,zeta=x"  # **kwargs: any key, sorted
    assert loose(Role.SELLER, 0).options == {"alpha": 2, "zeta": "x"}


def test_a_broken_entry_point_breaks_neither_other_specs_nor_the_listing(plugin_dist):
    assert resolve("mybot").kind == "plugin" and resolve("tft").kind == "rule"  # the built-in wins
    res = runner.invoke(app, ["agents"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[: len(known_specs())] == known_specs()
    assert "plugin agents (entry-point group nego.agents):" in lines
    by_name = {line.split()[0]: line for line in lines[len(known_specs()) + 1 :]}
    assert by_name["mybot"].split() == ["mybot", f"{PKG}.bots:MyBot", "from", "nego-plugin-testpkg", "0.1"]
    assert "broken:" in by_name["brokenbot"] and f"no module named '{PKG}.nowhere'" in by_name["brokenbot"]
    assert "broken:" in by_name["missingattr"] and "has no attribute 'Nobody'" in by_name["missingattr"]
    assert "shadowed: the built-in spec tft takes this name" in by_name["tft"]
    assert "shadowed: the built-in spec openai:<model>" in by_name["openai"]
    assert "broken" not in by_name["loose"] and "shadowed" not in by_name["mybot"]


def test_two_distributions_declaring_one_name_are_refused_by_name_not_silently_picked(plugin_dist):
    info = plugin_dist / "other_bots-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: other-bots\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[nego.agents]\nmybot = {PKG}.bots:Loose\n")
    plugins.clear_cache()
    with pytest.raises(
        UnknownSpecError, match=r"several entry points in nego.agents are named 'mybot'.*other-bots 1.0"
    ):
        resolve("mybot")
    assert resolve("loose").kind == "plugin"
    res = runner.invoke(app, ["agents"])
    assert res.exit_code == 0 and "broken: the name is also declared by" in res.output


def test_agents_says_when_no_plugin_is_installed(monkeypatch):
    monkeypatch.setattr(plugins, "_entry_points", lambda group: ())
    res = runner.invoke(app, ["agents"])
    assert res.exit_code == 0 and "boulware" in res.output
    assert "no plugin agents installed (entry-point group nego.agents)" in res.output


def test_builtin_forms_cover_rule_families_and_model_prefixes():
    assert builtin_form("walker") == "walker" and builtin_form("Boulware") == "boulware"
    assert builtin_form("openai") == "openai:<model>" and builtin_form("vllm") == "vllm:<model>@<url>"
    assert builtin_form("mine-rl") == "<name>-rl" and builtin_form("py") == "py:<module>:<attr>"
    assert builtin_form("4.5b") == "4.5b" and builtin_form("tiny") == "tiny"
    assert builtin_form("mybot") is None and builtin_form("tinyish") is None


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-(10**30), 10**30), st.floats(allow_nan=False, allow_infinity=False)))
def test_numbers_round_trip_with_their_type(value):
    parsed = parse_value(format_value(value))
    assert type(parsed) is type(value) and parsed == value


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters=",=:", blacklist_categories=("Cs",)), min_size=1))
def test_text_is_a_number_or_passes_through_unchanged(raw):
    try:
        value = parse_value(raw)
    except PluginError:
        return  # a number too large for a float
    if isinstance(value, str):
        assert value == raw
    else:
        assert parse_value(format_value(value)) == value


# --- scenario sources ----------------------------------------------------------------------------------------------


def test_scenario_sources_load_as_a_seed_function_or_a_list(plugin_dist):
    seeded = load_scenario_source("plugin:shop")
    assert callable(seeded) and isinstance(seeded(5), Scenario) and seeded(5) == seeded(5)
    fixed = load_scenario_source("plugin:shoplist")
    assert isinstance(fixed, list) and len(fixed) == 3
    assert load_scenario_source(f"py:{PKG}.bots:fixed") == fixed


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("plugin:nosuch", "no entry point 'nosuch' in nego.scenarios; installed: emptyshop, shop, shoplist"),
        ("plugin:emptyshop", "returned no scenarios"),
        (f"py:{PKG}.bots:not_a_scenario", "seed 0 gave a str object, not a Scenario"),
        (f"py:{PKG}.bots:MyBot", "it must take one argument (seed -> Scenario) or none"),
        (f"py:{PKG}.bots:NOT_CALLABLE", "not a callable"),
        ("py:no_such_module_xyz:make", "no module named 'no_such_module_xyz'"),
        ("py:no_such_module_xyz", "must look like <module>:<attr>"),
    ],
)
def test_bad_scenario_sources_fail_clearly(plugin_dist, source, fragment):
    with pytest.raises(ScenarioSourceError) as err:
        load_scenario_source(source)
    assert fragment in str(err.value) and repr(source) in str(err.value)


def test_simulate_runs_on_a_plugin_scenario_source_and_plugin_agents(plugin_dist, tmp_path):
    out = tmp_path / "run"
    args = ["simulate", "--days", "1", "--negotiations", "2", "--no-live", "--out", str(out)]
    res = runner.invoke(app, [*args, "--scenarios", "plugin:shop", "--sellers", "mybot", "--buyers", "picky"])
    assert res.exit_code == 0, res.output
    table = read_negotiations(out, latest=True)
    assert table.height == 2 and set(table["seller"]) == {"mybot"} and set(table["buyer"]) == {"picky"}
    assert all(i.startswith("plugin-shop-") for i in table["scenario_id"])
    assert "error" not in set(table["end_reason"])
    bad = runner.invoke(app, [*args, "--scenarios", "plugin:nosuch"])
    assert bad.exit_code == 2 and "no entry point 'nosuch'" in bad.output


def test_the_readme_example_is_a_conforming_plugin_agent(tmp_path, monkeypatch):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = readme.split("```python\n# mypkg/bots.py\n", 1)[1].split("```", 1)[0]
    module = "nego_readme_example_bots"
    (tmp_path / f"{module}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    factory = resolve(f"py:{module}:MyBot:aggr=0.2")
    assert factory.spec == f"py:{module}:MyBot:aggr=0.2" and factory(Role.BUYER, 3).aggr == 0.2
    assert check_negotiator(factory, seeds=(0,)).negotiations == 3 * 2 * 5
    sys.modules.pop(module, None)


def test_resolving_built_in_specs_never_imports_the_plugin_machinery():
    code = (
        "import sys; from nego.agents import resolve; resolve('boulware'); resolve('walker:k=4'); "
        "print('nego.agents.plugins' in sys.modules, 'importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "False"
