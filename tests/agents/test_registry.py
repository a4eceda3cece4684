"""Spec strings resolve to factories; bad specs fail up front with messages that say what is allowed."""

from __future__ import annotations

import sys
import types

import pytest
from nego.agents.registry import UnknownSpecError, known_specs, resolve, rule_spec_help
from nego.agents.rules.timedep import TimeDependent
from nego.scenarios.scenario import Role


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        ("boulware", "timedep:e=0.2"),
        ("linear", "timedep:e=1"),
        ("conceder", "timedep:e=2"),
        ("boulware:e=0.1", "timedep:e=0.1"),
        ("conceder:e=3", "timedep:e=3"),
        ("timedep:e=0.5,clock=negmas", "timedep:e=0.5,clock=negmas"),
        ("TFT", "tft"),
        ("hardliner:accept=0.9", "hardliner:accept=0.9"),
        ("random", "random"),
        ("walker:k=4, delta=0.02", "walker:k=4,delta=0.02"),
        ("picky:margin=0.15", "picky"),
    ],
)
def test_specs_resolve_to_canonical_rule_factories(spec, canonical):
    factory = resolve(spec)
    assert factory.spec == canonical and factory.kind == "rule"
    assert resolve(factory.spec) == factory  # the canonical spec names the same agent
    agent = factory(Role.BUYER, 3)
    assert hasattr(agent, "act")


def test_aliases_set_the_exponent():
    agent = resolve("boulware:e=0.1")(Role.SELLER, 0)
    assert isinstance(agent, TimeDependent) and agent.e == 0.1
    assert resolve("conceder")(Role.SELLER, 0).e == 2.0


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("nosuch", "known: boulware"),
        ("", "non-empty"),
        ("boulware:x=1", "unknown parameter 'x' for boulware; allowed: e, clock"),
        ("timedep", "needs e=<value>"),
        ("timedep:e=0", "e must be positive"),
        ("timedep:e=abc", "e must be a number"),
        ("timedep:e=nan", "must be finite"),
        ("walker:k=2.5", "k must be an integer"),
        ("walker:patience=0", "0 < patience <= 1"),
        ("hardliner:accept=2", "accept must lie in [0, 1]"),
        ("timedep:e=1,clock=wall", "clock must be one of own, negmas"),
        ("timedep:e=1,patience=0", "patience must lie in (0, 1]"),
        ("timedep:e=1,margin=-0.1", "margin must lie in [0, 1]"),
        ("tft:k", "key=value"),
        ("tft:k=1,k=2", "given twice"),
        ("random:seed=1", "allowed: none"),
    ],
)
def test_bad_specs_raise_clear_errors(spec, fragment):
    with pytest.raises(UnknownSpecError) as err:
        resolve(spec)
    assert fragment in str(err.value)
    assert isinstance(err.value, ValueError)


def test_model_specs_module_is_consulted_and_its_errors_propagate(monkeypatch):
    class Fake:
        spec, kind = "fake:1", "remote"

        def __call__(self, role, seed):
            raise AssertionError("not built in this test")

    def resolve_model_spec(spec, settings=None):
        if spec == "angry:x":
            raise ValueError("angry: bad model name 'x'")
        return Fake() if spec.startswith("fake:") else None

    module = types.ModuleType("nego.agents.model_specs")
    module.resolve_model_spec = resolve_model_spec
    module.known_model_specs = lambda: ["fake:<n>"]
    monkeypatch.setitem(sys.modules, "nego.agents.model_specs", module)
    assert resolve("fake:1").kind == "remote"
    with pytest.raises(ValueError, match="bad model name 'x'"):
        resolve("angry:x")
    with pytest.raises(UnknownSpecError, match="fake:<n>"):
        resolve("other:1")
    assert known_specs()[-1] == "fake:<n>"


def test_missing_model_specs_module_falls_through_to_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "nego.agents.model_specs", None)  # import raises ModuleNotFoundError
    with pytest.raises(UnknownSpecError, match="unknown negotiator spec 'openai:gpt'"):
        resolve("openai:gpt")


def test_help_lists_every_rule_family_with_defaults():
    help_ = rule_spec_help()
    assert {"timedep", "tft", "hardliner", "random", "walker", "picky", "boulware"} <= set(help_)
    assert "margin=0.15" in help_["picky"] and "e=<required>" in help_["timedep"]
