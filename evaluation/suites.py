"""Frozen evaluation suites and the training scenario stream that never overlaps them.

A suite is a fixed list of scenarios crossed with openers, negotiation seeds and buyer slots. The scenarios are
generated once from a recipe (seed, count, category and opposition cycles) and stored as package data with a
content hash over every scenario's content hash and the negotiation list; loading checks the hash, and
regenerating from the recipe gives the same hash. Buyer slots are filled with buyer specs at run time
(held-out rule-based families by default), so the same suite serves any pair of buyers.

A subset suite (``SuiteRecipe.subset_of``) plays some of another built-in suite's scenarios, chosen by
:func:`subset_indices`, with the same openers, seeds and buyer slots: each of its negotiations is one of that suite's
(same scenario, opener, seed, buyer slot and pairing key), so a seller and a buyer play the same outcome on a key in
both. Its file names the parent suite, the parent's hash and the chosen scenarios' indices and content hashes; loading
takes the scenarios from the parent and checks all three hashes. ``eval-192`` is such a subset of ``eval-1152``.

Seeds ``EVAL_SEED_RANGE`` are reserved for evaluation suites. :func:`training_stream` refuses them and, as a second
guard, drops any scenario whose preference problem (issues, weights, value functions, reservations) equals one in a
built-in suite.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
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
    scenarios step through the opposition levels.

    With ``subset_of`` (a built-in generated suite), the suite holds ``scenarios`` of that suite's scenarios instead,
    chosen by :func:`subset_indices`; ``seed``, ``max_rounds`` and ``opposition_levels`` are the parent's, and
    ``seeds``, ``openers`` and ``buyer_slots`` must lie within the parent's."""

    name: str
    seed: int
    scenarios: int
    seeds: tuple[int, ...]
    openers: tuple[Role, ...] = (Role.SELLER, Role.BUYER)
    buyer_slots: int = 2
    max_rounds: int = 10
    opposition_levels: tuple[float, ...] = OPPOSITION_LEVELS
    subset_of: str | None = None

    @property
    def negotiations(self) -> int:
        return self.scenarios * len(self.openers) * len(self.seeds) * self.buyer_slots

    def stratum(self, i: int) -> tuple[str, float]:
        """The category and opposition level of generated scenario ``i``."""
        levels = self.opposition_levels
        return CATEGORIES[i % len(CATEGORIES)].name, levels[(i + i // len(CATEGORIES)) % len(levels)]


_EVAL_1152 = SuiteRecipe("eval-1152", seed=900_001, scenarios=96, seeds=(0, 1, 2))

RECIPES = {
    "eval-1152": _EVAL_1152,
    "eval-192": replace(_EVAL_1152, name="eval-192", scenarios=16, subset_of="eval-1152"),
    "eval-dev": SuiteRecipe("eval-dev", seed=900_002, scenarios=24, seeds=(0,)),
}
"""The built-in suites: eval-1152 (96 x 2 openers x 3 seeds x 2 buyers), eval-192 (16 of eval-1152's scenarios with
all of its openers, seeds and buyer slots: 192 of its negotiations) and a 96-negotiation dev suite."""


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
        """The stored form: a subset suite names its parent's scenarios (see :func:`subset_entries`) instead of
        holding them."""
        r = self.recipe
        recipe = {
            "seed": r.seed,
            "scenarios": r.scenarios,
            "seeds": list(r.seeds),
            "openers": [o.value for o in r.openers],
            "buyer_slots": r.buyer_slots,
            "max_rounds": r.max_rounds,
            "opposition_levels": list(r.opposition_levels),
        }
        out = {"name": r.name, "hash": self.content_hash(), "recipe": recipe}
        if r.subset_of is None:
            return out | {"scenarios": [scenario_to_dict(s) for s in self.scenarios]}
        parent = load_suite(r.subset_of)
        recipe["subset_of"] = r.subset_of
        return out | {"subset_of_hash": parent.content_hash(), "scenarios": subset_entries(self, parent)}


def subset_indices(parent: Suite, count: int) -> tuple[int, ...]:
    """The indices (ascending) of the ``count`` scenarios a subset of the generated suite ``parent`` takes.

    Greedy and deterministic: ``count`` times, take the scenario not yet taken whose category has been taken least
    often so far, then whose opposition level has (the level the parent's recipe generated it at), then with the
    smallest content hash. So categories are taken equally often (some once more where ``count`` does not divide
    evenly), and so are opposition levels: every category of a generated suite with at least L scenarios per category
    holds every level.
    """
    if not 0 < count <= len(parent.scenarios):
        raise ValueError(f"a subset of {parent.name} takes 1 to {len(parent.scenarios)} scenarios, not {count}")
    strata = [parent.recipe.stratum(i) for i in range(len(parent.scenarios))]
    hashes = [s.content_hash() for s in parent.scenarios]
    by_category: dict[str, int] = {}
    by_level: dict[float, int] = {}
    taken: list[int] = []
    for _ in range(count):
        free = (i for i in range(len(strata)) if i not in taken)
        pick = min(free, key=lambda i: (by_category.get(strata[i][0], 0), by_level.get(strata[i][1], 0), hashes[i]))
        category, level = strata[pick]
        by_category[category] = by_category.get(category, 0) + 1
        by_level[level] = by_level.get(level, 0) + 1
        taken.append(pick)
    return tuple(sorted(taken))


def subset_entries(suite: Suite, parent: Suite) -> list[dict]:
    """How a subset suite's file names its scenarios: index in ``parent``, id and content hash of each."""
    where = {s.content_hash(): i for i, s in enumerate(parent.scenarios)}
    missing = [s.id for s in suite.scenarios if s.content_hash() not in where]
    if missing:
        raise ValueError(f"suite {suite.name}: scenarios {missing} are not in {parent.name}")
    return [{"index": where[s.content_hash()], "id": s.id, "hash": s.content_hash()} for s in suite.scenarios]


def _check_subset(recipe: SuiteRecipe, parent: SuiteRecipe) -> None:
    """Refuse a subset recipe whose negotiations are not all negotiations of ``parent``."""
    if parent.subset_of is not None:
        raise ValueError(f"suite {recipe.name}: {parent.name} is itself a subset suite")
    same = (recipe.seed, recipe.max_rounds, recipe.opposition_levels) == (
        parent.seed,
        parent.max_rounds,
        parent.opposition_levels,
    )
    within = set(recipe.seeds) <= set(parent.seeds) and set(recipe.openers) <= set(parent.openers)
    if not (same and within and recipe.buyer_slots <= parent.buyer_slots):
        raise ValueError(
            f"suite {recipe.name}: its seed, rounds and opposition levels must be {parent.name}'s, and its seeds, "
            f"openers and buyer slots within {parent.name}'s"
        )


def _parent_recipe(recipe: SuiteRecipe) -> SuiteRecipe:
    parent = RECIPES.get(recipe.subset_of or "")
    if parent is None:
        known = ", ".join(name for name, r in RECIPES.items() if r.subset_of is None)
        raise ValueError(f"suite {recipe.name}: subset of unknown suite {recipe.subset_of!r}; use one of {known}")
    _check_subset(recipe, parent)
    return parent


def generate_suite(recipe: SuiteRecipe) -> Suite:
    """Generate a suite's scenarios from its recipe (deterministic); a subset suite's from its parent's recipe."""
    if recipe.subset_of is not None:
        parent = generate_suite(_parent_recipe(recipe))
        return Suite(recipe, tuple(parent.scenarios[i] for i in subset_indices(parent, recipe.scenarios)))
    strata = [recipe.stratum(i) for i in range(recipe.scenarios)]
    scenarios = tuple(
        generate_scenario(
            recipe.seed, index=i, category=category, opposition=level, max_rounds=recipe.max_rounds, opener=Role.SELLER
        )
        for i, (category, level) in enumerate(strata)
    )
    return Suite(recipe, scenarios)


def _subset_scenarios(
    recipe: SuiteRecipe, entries: list[tuple[int, str, str]], parent_hash: str, source: str
) -> tuple[Scenario, ...]:
    """The scenarios a subset suite's file names, taken from its parent and checked against the hashes it lists."""
    try:
        _parent_recipe(recipe)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    parent = load_suite(str(recipe.subset_of))
    if parent.content_hash() != parent_hash:
        raise ValueError(
            f"{source}: built on {parent.name} with hash {parent_hash!r}, but {parent.name} has hash "
            f"{parent.content_hash()}: regenerate the subset with `nego.evaluation.suites.write_suite`"
        )
    out = []
    for index, scenario_id, content_hash in entries:
        if not 0 <= index < len(parent.scenarios):
            raise ValueError(f"{source}: {parent.name} has no scenario {index} (0..{len(parent.scenarios) - 1})")
        scenario = parent.scenarios[index]
        if (scenario.id, scenario.content_hash()) != (scenario_id, content_hash):
            raise ValueError(
                f"{source}: scenario {index} of {parent.name} is not the listed {scenario_id!r} with hash "
                f"{content_hash!r}; the suite was edited: regenerate it with `nego.evaluation.suites.write_suite`"
            )
        out.append(scenario)
    return tuple(out)


def _recipe_from_dict(data: dict) -> SuiteRecipe:
    r = data["recipe"]
    return SuiteRecipe(
        name=str(data["name"]),
        seed=int(r["seed"]),
        scenarios=int(r["scenarios"]),
        seeds=tuple(int(s) for s in r["seeds"]),
        openers=tuple(Role(o) for o in r["openers"]),
        buyer_slots=int(r["buyer_slots"]),
        max_rounds=int(r["max_rounds"]),
        opposition_levels=tuple(float(x) for x in r["opposition_levels"]),
        subset_of=None if r.get("subset_of") is None else str(r["subset_of"]),
    )


def suite_from_dict(data: dict, source: str = "suite data") -> Suite:
    """Rebuild a stored suite and check its hash (a subset suite's also against its parent, see
    :func:`subset_entries`); a mismatch means the file was edited or is corrupt."""
    try:
        recipe = _recipe_from_dict(data)
        if recipe.subset_of is None:
            scenarios = tuple(scenario_from_dict(s) for s in data["scenarios"])
        else:
            entries = [(int(s["index"]), str(s["id"]), str(s["hash"])) for s in data["scenarios"]]
            parent_hash = str(data["subset_of_hash"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: not a valid suite file ({type(e).__name__}: {e})") from e
    if recipe.subset_of is not None:
        scenarios = _subset_scenarios(recipe, entries, parent_hash, source)
    suite = Suite(recipe, scenarios)
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
    """A built-in suite by name (``eval-1152``, ``eval-192``, ``eval-dev``) or a suite JSON file by path."""
    if name_or_path in RECIPES:
        path = data_path(name_or_path)
        if not path.exists():
            raise FileNotFoundError(f"suite data {path} is missing from the package: reinstall nego")
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"unknown suite {name_or_path!r}: use one of {', '.join(RECIPES)} or a suite JSON path")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a valid suite file (not JSON: {e})") from None
    return suite_from_dict(data, str(path))


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
