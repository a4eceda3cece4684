"""Behaviour cloning reads a batch in passes of similar length: the same step as one padded pass, fewer tokens."""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.training.sft import length_groups


def cost(lengths, groups, overhead):
    return sum(len(g) * max(lengths[i] for i in g) + overhead for g in groups)


def best_cost(lengths, overhead, max_tokens=None):
    """Every way to cut the sorted lengths into runs (each within ``max_tokens`` unless a single row), one by one."""
    srt = sorted(lengths)
    n = len(srt)
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = list(itertools.pairwise([0, *(i + 1 for i, c in enumerate(cuts) if c), n]))
        if max_tokens is not None and any(b - a > 1 and (b - a) * srt[b - 1] > max_tokens for a, b in bounds):
            continue
        best = min(best, sum((b - a) * srt[b - 1] + overhead for a, b in bounds))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=9), st.integers(0, 400))
def test_length_groups_cover_the_batch_once_at_the_least_cost(lengths, overhead):
    groups = length_groups(lengths, overhead)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(g for g in groups)
    assert cost(lengths, groups, overhead) == best_cost(lengths, overhead)
    assert cost(lengths, groups, overhead) <= len(lengths) * max(lengths) + overhead  # never worse than one pass


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=9), st.integers(0, 400), st.integers(1, 900))
def test_capped_passes_hold_at_most_the_cap_at_the_least_cost(lengths, overhead, cap):
    groups = length_groups(lengths, overhead, max_tokens=cap)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(len(g) == 1 or len(g) * max(lengths[i] for i in g) <= cap for g in groups)
    assert cost(lengths, groups, overhead) == best_cost(lengths, overhead, cap)


def test_one_long_row_gets_a_pass_of_its_own():
    lengths = [40, 41, 39, 42, 38, 40, 170, 41]
    groups = length_groups(lengths, overhead=128)
    assert [6] in groups and len(groups) == 2


@pytest.fixture(scope="module")
def traces():
    from nego.training.config import TrainConfig
    from nego.training.pool import BuyerPool
    from nego.training.rollout import split_scenarios
    from nego.training.sft import record_transcripts

    cfg = TrainConfig()
    scenarios = split_scenarios("train", 16, cfg.max_rounds)
    return record_transcripts(scenarios, 24, cfg.sft_sellers, BuyerPool(tuple(cfg.train_buyers)), 0)


def test_passes_by_length_add_up_to_the_gradient_of_one_padded_pass(traces):
    torch = pytest.importorskip("torch")
    from nego.training.sft import _accumulate, _tensors, behaviour_clone
    from nego.training.tiny_model import build_tiny_model
    from nego.training.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    base = build_tiny_model(tok, seed=0)  # built once (seconds), copied for each run
    model = copy.deepcopy(base)
    ids, att, labels = _tensors(traces[:16], tok.get_vocab())
    lengths = att.sum(1).tolist()
    assert max(lengths) > 2 * min(lengths) and len(length_groups(lengths)) > 1  # a batch worth splitting
    seen = {}
    for arm, by_length, cap in (("lengths", True, None), ("one pass", False, None), ("capped", True, max(lengths))):
        model.zero_grad(set_to_none=True)
        loss = _accumulate(model, ids, att, labels, by_length, pass_tokens=cap)
        seen[arm] = loss, [p.grad.clone() for p in model.parameters()]
    assert len(length_groups(lengths, max_tokens=max(lengths))) >= len(lengths) // 2  # the cap splits it further
    for arm in ("lengths", "capped"):
        assert seen[arm][0] == pytest.approx(seen["one pass"][0], rel=1e-6)
        for a, b in zip(seen[arm][1], seen["one pass"][1], strict=True):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)
    # whole runs: the same losses step by step (Adam's first steps magnify float noise in near-zero gradients, so
    # the weights are compared through the losses they give)
    runs = [
        behaviour_clone(copy.deepcopy(base), tok, traces, steps=2, lr=3e-3, batch=8, seed=0, by_length=b)
        for b in (True, False)
    ]
    assert runs[0].steps == runs[1].steps == 2
    assert runs[0].first_loss == pytest.approx(runs[1].first_loss, rel=1e-6)
    assert runs[0].final_loss == pytest.approx(runs[1].final_loss, rel=1e-4)


def test_best_episodes_keep_the_highest_seller_utility_first_among_equals():
    from types import SimpleNamespace

    from nego.training.sft import best_episodes

    def played(u, name):
        return SimpleNamespace(result=SimpleNamespace(outcome=SimpleNamespace(seller_utility=u)), seller_record=name)

    groups = [[played(0.4, "a0"), played(0.7, "b0"), played(0.5, "c0")], [played(0.6, "a1"), played(0.6, "b1")]]
    assert [p.seller_record for p in best_episodes(groups)] == ["b0", "a1"]


def test_best_pick_plays_every_seller_on_each_episode(tmp_path):
    """Every seller plays each warm-start episode on the same scenario, buyer and seed, and the choice is seeded."""
    import polars as pl
    from nego.market.transcripts import TranscriptWriter, read_negotiations
    from nego.training.config import TrainConfig
    from nego.training.pool import BuyerPool
    from nego.training.rollout import split_scenarios
    from nego.training.sft import record_transcripts

    cfg = TrainConfig()
    scenarios = split_scenarios("train", 8, cfg.max_rounds)
    pool = BuyerPool(tuple(cfg.train_buyers))
    sellers = ["timedep:e=0.3", "tft", "timedep:e=3"]
    with TranscriptWriter(tmp_path / "best") as writer:
        best = record_transcripts(scenarios, 12, sellers, pool, 0, writer, pick="best")
    again = record_transcripts(scenarios, 12, sellers, pool, 0, pick="best")
    assert len(best) == 12
    assert [t.words for t in best] == [t.words for t in again]
    rows = read_negotiations(tmp_path / "best")
    assert rows.height == 12 * len(sellers)
    per_episode = rows.with_columns(pl.col("negotiation_id").str.replace(r"-\d+$", "").alias("episode"))
    same = per_episode.group_by("episode").agg(
        pl.col("scenario_id").n_unique().alias("scenarios"),
        pl.col("buyer").n_unique().alias("buyers"),
        pl.col("seed").n_unique().alias("seeds"),
        pl.col("seller").n_unique().alias("sellers"),
    )
    assert same.height == 12
    assert (same["scenarios"] == 1).all() and (same["buyers"] == 1).all() and (same["seeds"] == 1).all()
    assert (same["sellers"] == len(sellers)).all()
