"""A tiny frozen suite for end-to-end evaluation tests, and launcher jobs that import what the tests import."""

from __future__ import annotations

import os

import pytest
from nego.evaluation.suites import SuiteRecipe, generate_suite, write_suite

from .fake_training import importable_root


@pytest.fixture(scope="session")
def tiny_suite_path(tmp_path_factory):
    """4 scenarios x 2 openers x 1 seed x 2 buyer slots = 16 negotiations per arm (+8 diagnostic)."""
    recipe = SuiteRecipe("eval-tiny", seed=900_900, scenarios=4, seeds=(0,), max_rounds=6)
    return write_suite(generate_suite(recipe), tmp_path_factory.mktemp("suite") / "suite-eval-tiny.json")


@pytest.fixture
def submitit_jobs(monkeypatch):
    """submitit installed, and its subprocesses importing nego and the test helpers as this process does."""
    pytest.importorskip("submitit")
    paths = [importable_root(), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
