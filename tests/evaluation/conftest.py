"""A tiny frozen suite for end-to-end evaluation tests."""

from __future__ import annotations

import pytest
from nego.evaluation.suites import SuiteRecipe, generate_suite, write_suite


@pytest.fixture(scope="session")
def tiny_suite_path(tmp_path_factory):
    """4 scenarios x 2 openers x 1 seed x 2 buyer slots = 16 negotiations per arm (+8 diagnostic)."""
    recipe = SuiteRecipe("eval-tiny", seed=900_900, scenarios=4, seeds=(0,), max_rounds=6)
    return write_suite(generate_suite(recipe), tmp_path_factory.mktemp("suite") / "suite-eval-tiny.json")
