"""Frozen evaluation suites and the training scenario stream that never overlaps them.

A suite is a fixed list of scenarios crossed with openers, negotiation seeds and buyer slots. The scenarios are
generated once from a recipe (seed, count, category and opposition cycles) and stored as package data with a
content hash over every scenario's content hash and the negotiation list; loading checks the hash, and
regenerating from the recipe gives the same hash. Buyer slots are filled with buyer specs at run time
(held-out rule-based families by default), so the same suite serves any pair of buyers.

Seeds ``EVAL_SEED_RANGE`` are reserved for evaluation suites. :func:`training_stream` refuses them and, as a second
guard, drops any scenario whose preference problem (issues, weights, value functions, reservations) equals one in a
built-in suite.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from nego.agents.rules.heldout import HELD_OUT_FAMILIES
from nego.scenarios.catalog import CATEGORIES
from nego.scenarios.generator import generate_scenario
from nego.scenarios.io import scenario_from_dict, scenario_to_dict
from nego.scenarios.scenario import Role, Scenario

logger = logging.getLogger(__name__)

EVAL_SEED_RANGE = range(900_000, 1_000_000)
"""Generator seeds reserved for evaluation suites; training scenarios come from seeds outside it."""

DEFAULT_BUYERS = HELD_OUT_FAMILIES
"""Held-out buyer families: not in the default training pool (time-dependent buyers) and different in their end
game (walking away when offers stall; accepting only well above reservation)."""

DIAGNOSTIC_BUYER = "hardliner"
"""Always reported beside the suite, on extra negotiations that are not part of it."""

OPPOSITION_LEVELS = (0.2, 0.4, 0.6, 0.8)


@dataclass(frozen=True, slots=True)
class SuiteRecipe:
    """How a suite's scenarios are generated: scenario i has the category ``i % C`` and the opposition level
    ``(i + i // C) % L`` (C categories, L levels), so small suites already cover every category and a category's
    scenarios step through the opposition levels."""

    name: str
    seed: int
    scenarios: int
    seeds: tuple[int, ...]
    openers: tuple[Role, ...] = (Role.SELLER, Role.BUYER)
    buyer_slots: int = 2
    max_rounds: int = 10
    opposition_levels: tuple[float, ...] = OPPOSITION_LEVELS

    @property
    def negotiations(self) -> int:
        return self.scenarios * len(self.openers) * len(self.seeds) * self.buyer_slots


RECIPES = {
    "eval-1152": SuiteRecipe("eval-1152", seed=900_001, scenarios=96, seeds=(0, 1, 2)),
    "eval-dev": SuiteRecipe("eval-dev", seed=900_002, scenarios=24, seeds=(0,)),
}
"""The built-in suites: eval-1152 (96 x 2 openers x 3 seeds x 2 buyers) and a 96-negotiation dev suite."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One negotiation of a suite, before buyer specs are filled in."""

    scenario: Scenario
    seed: int
    buyer_slot: int

    @property
    def key(self) -> str:
        """The pairing key: identical across arms, distinct across the suite's negotiations."""
        return f"{self.scenario.id}/{self.scenario.opener.value}/s{self.seed}/b{self.buyer_slot}"


@dataclass(frozen=True, slots=True)
class Suite:
    """A frozen suite: its recipe and its scenarios (stored with the seller opening)."""

    recipe: SuiteRecipe
    scenarios: tuple[Scenario, ...]

    @property
    def name(self) -> str:
        return self.recipe.name

    def variants(self) -> dict[str, Scenario]:
        """Every scenario as played (one per opener), keyed by content hash."""
        out = {}
        for s in self.scenarios:
            for opener in self.recipe.openers:
                v = s.with_opener(opener)
                out[v.content_hash()] = v
        return out

    def slots(self) -> list[Slot]:
        """The negotiation list in a fixed order: scenario, opener, seed, buyer slot."""
        return [
            Slot(s.with_opener(opener), seed, b)
            for s in self.scenarios
            for opener in self.recipe.openers
            for seed in self.recipe.seeds
            for b in range(self.recipe.buyer_slots)
        ]

    def content_hash(self) -> str:
        """sha256 (16 hex digits) over the scenarios' content hashes and the negotiation list."""
        blob = {
            "scenarios": [s.content_hash() for s in self.scenarios],
            "negotiations": [[x.scenario.content_hash(), x.seed, x.buyer_slot] for x in self.slots()],
        }
        text = json.dumps(blob, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        r = self.recipe
        return {
            "name": r.name,
            "hash": self.content_hash(),
            "recipe": {
                "seed": r.seed,
                "scenarios": r.scenarios,
                "seeds": list(r.seeds),
                "openers": [o.value for o in r.openers],
                "buyer_slots": r.buyer_slots,
                "max_rounds": r.max_rounds,
                "opposition_levels": list(r.opposition_levels),
            },
            "scenarios": [scenario_to_dict(s) for s in self.scenarios],
        }


def generate_suite(recipe: SuiteRecipe) -> Suite:
    """Generate a suite's scenarios from its recipe (deterministic)."""
    levels = recipe.opposition_levels
    scenarios = tuple(
        generate_scenario(
            recipe.seed,
            index=i,
            category=CATEGORIES[i % len(CATEGORIES)].name,
            opposition=levels[(i + i // len(CATEGORIES)) % len(levels)],
            max_rounds=recipe.max_rounds,
            opener=Role.SELLER,
        )
        for i in range(recipe.scenarios)
    )
    return Suite(recipe, scenarios)


def suite_from_dict(data: dict, source: str = "suite data") -> Suite:
    """Rebuild a stored suite and check its hash; a mismatch means the file was edited or is corrupt."""
    try:
        r = data["recipe"]
        recipe = SuiteRecipe(
            name=str(data["name"]),
            seed=int(r["seed"]),
            scenarios=int(r["scenarios"]),
            seeds=tuple(int(s) for s in r["seeds"]),
            openers=tuple(Role(o) for o in r["openers"]),
            buyer_slots=int(r["buyer_slots"]),
            max_rounds=int(r["max_rounds"]),
            opposition_levels=tuple(float(x) for x in r["opposition_levels"]),
        )
        suite = Suite(recipe, tuple(scenario_from_dict(s) for s in data["scenarios"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: not a valid suite file ({type(e).__name__}: {e})") from e
    if len(suite.scenarios) != recipe.scenarios:
        raise ValueError(f"{source}: recipe says {recipe.scenarios} scenarios, file holds {len(suite.scenarios)}")
    if suite.content_hash() != data.get("hash"):
        raise ValueError(
            f"{source}: stored hash {data.get('hash')!r} does not match the content ({suite.content_hash()}); "
            "the suite was edited: regenerate it with `nego.evaluation.suites.write_suite`"
        )
    return suite


def data_path(name: str) -> Path:
    return Path(str(resources.files("nego.scenarios.data").joinpath(f"suite-{name}.json")))


def write_suite(suite: Suite, path: Path | None = None) -> Path:
    """Store a suite as JSON (by default as the package data file of a built-in suite)."""
    target = path or data_path(suite.name)
    target.write_text(json.dumps(suite.to_dict(), indent=1) + "\n")
    return target


@cache
def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name (``eval-1152``, ``eval-dev``) or a suite JSON file by path."""
    if name_or_path in RECIPES:
        path = data_path(name_or_path)
        if not path.exists():
            raise FileNotFoundError(f"suite data {path} is missing from the package: reinstall nego")
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"unknown suite {name_or_path!r}: use one of {', '.join(RECIPES)} or a suite JSON path")
    return suite_from_dict(json.loads(path.read_text()), str(path))


def problem_fingerprint(scenario: Scenario) -> str:
    """A hash of the bargaining problem alone: issues and both sides' preferences (no id, wording or opener)."""
    d = scenario_to_dict(scenario)
    core = {
        "issues": d["issues"],
        **{side: {k: v for k, v in d[side].items() if k != "brief"} for side in ("seller", "buyer")},
    }
    text = json.dumps(core, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@cache
def evaluation_fingerprints() -> frozenset[str]:
    """Problem fingerprints of every built-in suite's scenarios."""
    return frozenset(problem_fingerprint(s) for name in RECIPES for s in load_suite(name).scenarios)


def training_stream(seed: int, *, max_rounds: int = 10, start: int = 0) -> Iterator[Scenario]:
    """An endless stream of generated training scenarios that never contains an evaluation scenario.

    ``seed`` must lie outside :data:`EVAL_SEED_RANGE`; a scenario whose problem matches a built-in suite's is
    skipped and logged (a guard: with distinct seeds the generator does not produce one).
    """
    if seed in EVAL_SEED_RANGE:
        raise ValueError(
            f"seed {seed} is reserved for evaluation suites ({EVAL_SEED_RANGE.start}..{EVAL_SEED_RANGE.stop - 1}); "
            "pick a training seed outside that range"
        )
    held_out = evaluation_fingerprints()
    index = start
    while True:
        scenario = generate_scenario(seed, index=index, max_rounds=max_rounds)
        index += 1
        if problem_fingerprint(scenario) in held_out:
            logger.warning("training stream %d: skipped scenario %s, an evaluation problem", seed, scenario.id)
            continue
        yield scenario
