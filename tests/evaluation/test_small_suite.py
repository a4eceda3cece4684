"""eval-192: sixteen of eval-1152's scenarios with all of its openers, seeds and buyer slots, played as the very
negotiations eval-1152 plays."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import polars as pl
import pytest
from nego.agents.registry import resolve
from nego.evaluation import suites
from nego.evaluation.config import EvalConfig
from nego.evaluation.runner import evaluate
from nego.evaluation.suites import RECIPES, generate_suite, load_suite, subset_indices, suite_from_dict
from nego.market.transcripts import read_negotiations
from nego.scenarios.catalog import CATEGORIES

SELLERS = ("tft", "random")
"""A deterministic seller and one that draws its offers from the negotiation's seed."""


def stored_eval_192() -> dict:
    return json.loads(suites.data_path("eval-192").read_text())


def test_eval_192_is_a_subset_of_eval_1152s_negotiations():
    small, full = load_suite("eval-192"), load_suite("eval-1152")
    slots = small.slots()
    assert len(slots) == small.recipe.negotiations == 192 and len({x.key for x in slots}) == 192
    by_key = {x.key: x for x in full.slots()}
    for x in slots:
        twin = by_key[x.key]
        assert x.scenario.content_hash() == twin.scenario.content_hash() and x.scenario.id == twin.scenario.id
        assert (x.scenario.opener, x.seed, x.buyer_slot) == (twin.scenario.opener, twin.seed, twin.buyer_slot)
    assert {x.seed for x in slots} == {0, 1, 2} and {x.buyer_slot for x in slots} == {0, 1}
    assert {x.scenario.opener for x in slots} == set(full.recipe.openers)
    assert {s.category for s in small.scenarios} == {c.name for c in CATEGORIES} == {s.category for s in full.scenarios}


def test_eval_192_takes_every_category_and_opposition_level_evenly():
    full = load_suite("eval-1152")
    indices = subset_indices(full, 16)
    assert [full.scenarios[i] for i in indices] == list(load_suite("eval-192").scenarios)
    categories = Counter(full.recipe.stratum(i)[0] for i in indices)
    levels = Counter(full.recipe.stratum(i)[1] for i in indices)
    assert set(categories.values()) == {1, 2} and len(categories) == len(CATEGORIES)
    assert levels == dict.fromkeys(full.recipe.opposition_levels, 4)


def test_eval_192_is_stored_small_and_names_its_parent():
    data = stored_eval_192()
    assert data["recipe"]["subset_of"] == "eval-1152"
    assert data["subset_of_hash"] == load_suite("eval-1152").content_hash()
    assert all(set(entry) == {"index", "id", "hash"} for entry in data["scenarios"])
    assert suite_from_dict(data).content_hash() == data["hash"] == load_suite("eval-192").content_hash()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["scenarios"][0].update(index=d["scenarios"][0]["index"] + 1), "is not the listed"),
        (lambda d: d["scenarios"][3].update(hash="0123456789abcdef"), "with hash '0123456789abcdef'"),
        (lambda d: d["scenarios"][3].update(id="laptops-1-2"), "is not the listed 'laptops-1-2'"),
        (lambda d: d["scenarios"][3].update(index=96), "eval-1152 has no scenario 96"),
        (lambda d: d["recipe"].update(seeds=[0, 1]), "does not match the content"),
        (lambda d: d["scenarios"].pop(), "recipe says 16 scenarios"),
        (lambda d: d.update(subset_of_hash="feedfacefeedface"), "built on eval-1152 with hash 'feedfacefeedface'"),
        (lambda d: d["recipe"].update(subset_of="eval-9"), "subset of unknown suite 'eval-9'"),
        (lambda d: d["recipe"].update(subset_of="eval-dev"), "must be eval-dev's"),
        (lambda d: d["recipe"].update(seeds=[0, 7]), "within eval-1152's"),
        (lambda d: d.pop("subset_of_hash"), "not a valid suite file"),
    ],
    ids=[
        "index",
        "hash",
        "id",
        "index-out-of-range",
        "seeds",
        "scenario-dropped",
        "parent-hash",
        "unknown-parent",
        "other-parent",
        "seed-outside-parent",
        "parent-hash-missing",
    ],
)
def test_an_edited_eval_192_file_is_refused(tmp_path, edit, message):
    data = stored_eval_192()
    edit(data)
    path = tmp_path / "suite-eval-192.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        load_suite(str(path))


def test_a_subset_recipe_outside_its_parent_is_refused():
    with pytest.raises(ValueError, match="within eval-1152's"):
        generate_suite(replace(RECIPES["eval-192"], buyer_slots=3))
    with pytest.raises(ValueError, match="1 to 96 scenarios"):
        generate_suite(replace(RECIPES["eval-192"], scenarios=97))


def outcomes(tmp_path, suite: str) -> pl.DataFrame:
    """Per arm and pairing key: seller utility, end reason and turns of ``SELLERS`` on ``suite`` (diagnostics too)."""
    out = tmp_path / suite
    config = EvalConfig(sellers=SELLERS, out=out, suite=suite, baselines=(), optimality_gap=False, resamples=1_000)
    metrics = evaluate(config, resolve).metrics.select("negotiation_id", "arm", "key")
    played = read_negotiations(out / "transcripts", latest=True)
    columns = ("negotiation_id", "seller_utility", "end_reason", "turns", "agreement")
    return metrics.join(played.select(columns), on="negotiation_id", how="left")


def test_eval_192_plays_the_outcomes_eval_1152_plays_on_the_same_keys(tmp_path):
    small, full = outcomes(tmp_path, "eval-192"), outcomes(tmp_path, "eval-1152")
    assert small.height == 2 * (192 + 32) and small["key"].str.ends_with("/diag").sum() == 2 * 32
    same = full.join(small, on=["arm", "key"], how="semi").sort("arm", "key")
    assert same.height == small.height
    assert small.sort("arm", "key").equals(same)
    assert small["end_reason"].n_unique() > 1 and small["turns"].n_unique() > 1
