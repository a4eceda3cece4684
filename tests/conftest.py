"""Shared fixtures: small hand-written scenarios that every package's tests can use."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from nego.scenarios.issues import Issue, IssueKind
from nego.scenarios.preferences import Preferences, ValueFunction
from nego.scenarios.scenario import Scenario


def make_widget_scenario(seller_brief: str = "", buyer_brief: str = "", max_rounds: int = 6) -> Scenario:
    issues = (
        Issue("price", IssueKind.INT, low=50, high=150, step=5, unit="USD"),
        Issue("quantity", IssueKind.INT, low=1, high=10, unit="units"),
        Issue("warranty", IssueKind.CATEGORICAL, options=("none", "1y", "2y")),
    )
    seller = Preferences(
        {"price": 0.6, "quantity": 0.2, "warranty": 0.2},
        {
            "price": ValueFunction.increasing(),
            "quantity": ValueFunction.increasing(),
            "warranty": ValueFunction.options({"none": 1.0, "1y": 0.5, "2y": 0.0}),
        },
        reservation=0.3,
    )
    buyer = Preferences(
        {"price": 0.5, "quantity": 0.1, "warranty": 0.4},
        {
            "price": ValueFunction.decreasing(),
            "quantity": ValueFunction.increasing(),
            "warranty": ValueFunction.options({"none": 0.0, "1y": 0.6, "2y": 1.0}),
        },
        reservation=0.3,
    )
    return Scenario(
        "widgets-1",
        "industrial widgets",
        "A distributor buys widgets from a manufacturer.",
        issues,
        seller,
        buyer,
        max_rounds=max_rounds,
        seller_brief=seller_brief,
        buyer_brief=buyer_brief,
    )


@pytest.fixture
def widget_scenario() -> Scenario:
    return make_widget_scenario()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module of tiny models: a second thread only adds waiting, a lot of it on a busy
    machine (use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
