"""The shape of nego.agents: one factory contract for every caller, and specs parsed in one public place."""

from __future__ import annotations

import ast
from pathlib import Path

import nego
import nego.agents
import nego.agents.registry
import nego.agents.remote.server
import nego.market
import nego.market.marketplace
from nego.agents import params, plugins, registry

ROOT = Path(nego.__file__).resolve().parent


def _imports(module: object) -> list[tuple[str, list[str]]]:
    """(module as written, imported names) of every ``from X import ...`` in ``module``'s source, nested ones too."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    return [
        ("." * node.level + (node.module or ""), [a.name for a in node.names])
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    ]


def test_negotiator_factory_is_one_class_seen_from_everywhere():
    ours = nego.market.marketplace.NegotiatorFactory
    assert nego.agents.NegotiatorFactory is ours
    assert nego.market.NegotiatorFactory is ours
    assert nego.agents.registry.NegotiatorFactory is ours
    assert nego.agents.remote.server.NegotiatorFactory is ours
    assert "NegotiatorFactory" in nego.agents.__all__


def test_negotiator_factory_is_defined_once_in_the_whole_package():
    def ours(path):  # the package's own files: no tests, no virtualenv or other hidden folder inside the checkout
        parts = path.relative_to(ROOT).parts
        return "tests" not in parts and not any(part.startswith(".") for part in parts)

    defined = [
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*.py")
        if ours(path) and "class NegotiatorFactory" in path.read_text(encoding="utf-8")
    ]
    assert defined == ["market/marketplace.py"]


def test_registry_and_plugins_share_the_public_spec_syntax_and_not_each_other():
    for module, other in ((plugins, "registry"), (registry, "plugins")):
        for source, names in _imports(module):
            if source.rpartition(".")[2] == other:
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{module.__name__} imports private names of {other}: {private}"
    assert not [s for s, _ in _imports(plugins) if s.rpartition(".")[2] == "registry"], "plugins imports registry"
    assert plugins.parse_params is registry.parse_params is params.parse_params
    assert plugins.UnknownSpecError is registry.UnknownSpecError is params.UnknownSpecError
    assert nego.agents.UnknownSpecError is params.UnknownSpecError
