"""Shared fixtures: small hand-written scenarios that every package's tests can use."""

from __future__ import annotations

import os
from pathlib import Path

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


LONGEST = (
    "tests/training/test_preflight.py::test_train_on_a_tiny_gemma4_at_the_defaults",
    "tests/training/test_smollm2_train.py::",
)
"""Tests that take minutes on two cores: they start before every other, so that neither ends last alone."""


def pytest_collection_modifyitems(config, items):
    """The :data:`LONGEST` tests first, then the others marked ``slow`` (each in its order), so that a long test does
    not start last and leave the other test process idle."""

    def rank(item) -> int:
        if item.nodeid.startswith(LONGEST):
            return 0
        return 1 if item.get_closest_marker("slow") is not None else 2

    items.sort(key=rank)


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


# ------------------------------------------------------------------ the real SmolLM2 model, converted once

PROMPTS = ("Hello", 'The seller offers {"price": 120, "quantity": 5}.', "Twelve chairs, two-year warranty?")


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """One real conversion into a temporary ``$NEGO_HOME``, and the reference it must equal: the tokenizer and the
    logits on :data:`PROMPTS` of the model that transformers loads from the GGUF file during that conversion
    (``from_pretrained(folder, gguf_file=name)``), both taken as soon as they are loaded, before the conversion goes
    on. The suite's test processes (pytest-xdist) share it: the first converts and saves the reference beside the
    converted home, the others wait for it and read both; the tests only read them."""
    import torch
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        shared = shared.parent  # the folder above each test process's own, made for this test run
    shared /= "smollm2-converted"
    shared.mkdir(exist_ok=True)
    saved = shared / "reference.pt"
    with FileLock(str(shared / "lock")):
        if not saved.exists():
            folder, logits, tok = _convert_smollm2(shared / "home")
            torch.save({"folder": str(folder), "logits": logits, "tok": tok}, shared / "reference.tmp")
            (shared / "reference.tmp").replace(saved)
    ref = torch.load(saved, weights_only=False)  # a tokenizer object: saved by this test run's own fixture
    return shared / "home", Path(ref["folder"]), ref["logits"], ref["tok"]


def _convert_smollm2(home: Path) -> tuple[Path, dict, object]:
    import copy

    import torch
    import transformers
    from nego.agents.llm.backends import smollm2

    home.mkdir(parents=True, exist_ok=True)
    loaded: dict[str, object] = {}

    def reference(obj):
        if isinstance(obj, torch.nn.Module):
            with torch.no_grad():
                ids = [loaded["tok"](text, return_tensors="pt").input_ids for text in PROMPTS]
                return {text: (i, obj.eval()(i).logits) for text, i in zip(PROMPTS, ids, strict=True)}
        return copy.deepcopy(obj)  # the tokenizer as loaded, whatever the conversion does with its own

    def spying(auto_class, key):
        real = auto_class.from_pretrained

        def from_pretrained(*args, **kwargs):
            obj = real(*args, **kwargs)
            if kwargs.get("gguf_file"):
                loaded[key] = reference(obj)
            return obj

        return from_pretrained

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEGO_HOME", str(home))
        for auto_class, key in [(transformers.AutoTokenizer, "tok"), (transformers.AutoModelForCausalLM, "logits")]:
            mp.setattr(auto_class, "from_pretrained", spying(auto_class, key))
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            folder = Path(smollm2.smollm2_source())
        finally:
            torch.set_num_threads(before)
    assert set(loaded) == {"tok", "logits"}
    return folder, loaded["logits"], loaded["tok"]
