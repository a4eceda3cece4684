"""Decoding for the compact policy: a cache kept across a negotiation's turns gives the tokens and log-probabilities
that re-reading the whole context gives, whoever shares the batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from nego.agents.compact.protocol import KVCache, generate_turns  # noqa: E402


@dataclass
class Req:
    ids: list[int]
    max_new: int
    temperature: float | None
    generator: Any
    cache: KVCache | None = None


@pytest.fixture(scope="module")
def tiny():
    from nego.training.tiny_model import build_tiny_model
    from nego.training.tokenizer import build_tokenizer

    tok = build_tokenizer()
    return build_tiny_model(tok, seed=0).eval(), tok


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TEMPERATURES = [1.0, 1.0, 0.7, None, 1.3]
TURNS = [[0, 1, 2, 3, 4], [0, 2, 4], [1, 2, 3, 4], [4, 0], [3], [0, 1, 2, 3, 4]]
"""Which negotiations ask on each turn: batches form and break up as negotiations fall out of step."""


def play(model, tok, keep: bool, seed: int = 0):
    """Six turns of five negotiations: each turn adds some environment ids to the asking rows' contexts, then
    decodes; returns every row's (ids, logprobs) per turn and the final contexts."""
    rng = torch.Generator().manual_seed(seed)
    vocab = len(tok)
    contexts = [torch.randint(5, vocab, (int(torch.randint(3, 8, (1,), generator=rng)),), generator=rng).tolist()]
    contexts += [torch.randint(5, vocab, (3 + row,), generator=rng).tolist() for row in range(1, 5)]
    gens = [torch.Generator().manual_seed(100 + row) for row in range(5)]
    caches = [KVCache() if keep else None for _ in range(5)]
    pad, eot = tok.pad_token_id, tok.get_vocab()["<eot>"]
    out = []
    for turn, rows in enumerate(TURNS):
        for row in rows:
            if turn:
                contexts[row] += torch.randint(5, vocab, (2 + (row + turn) % 7,), generator=rng).tolist()
        batch = [
            Req(list(contexts[row]), 3 + (row + turn) % 5, TEMPERATURES[row], gens[row], caches[row]) for row in rows
        ]
        results = generate_turns(model, batch, pad, eot)
        for row, req, (ids, lps) in zip(rows, batch, results, strict=True):
            out.append((turn, row, ids, lps))
            contexts[row] += ids
            if keep:
                cache = caches[row]
                assert cache.ids == req.ids + ids[:-1]  # all but the last token, which the next turn reads first
                assert cache.kv.shape[3] == len(cache.ids)
    return out, contexts


def test_a_kept_cache_gives_the_tokens_and_logprobs_of_rereading_the_context(tiny):
    model, tok = tiny
    kept, ctx_kept = play(model, tok, keep=True)
    reread, ctx_reread = play(model, tok, keep=False)
    assert ctx_kept == ctx_reread
    for (turn, row, ids_a, lp_a), (_, _, ids_b, lp_b) in zip(kept, reread, strict=True):
        assert ids_a == ids_b, (turn, row)
        assert lp_a == pytest.approx(lp_b, abs=1e-5), (turn, row)


def test_a_row_decodes_the_same_alone_and_in_a_batch(tiny):
    model, tok = tiny
    pad, eot = tok.pad_token_id, tok.get_vocab()["<eot>"]
    ids = [1, 20, 30, 40, 50, 60]

    def run(mates: int):
        cache = KVCache()
        results = []
        for turn in range(3):
            mine = Req(ids + [7 + turn] * (turn + 1), 5, 1.0, torch.Generator().manual_seed(turn), cache)
            others = [
                Req([1] + [9 + m] * (2 + 3 * m), 2 + m, 1.0, torch.Generator().manual_seed(m), KVCache())
                for m in range(mates)
            ]
            results.append(generate_turns(model, [*others[:1], mine, *others[1:]], pad, eot)[min(mates, 1)])
        return results

    alone, crowded = run(0), run(3)
    assert [r[0] for r in alone] == [r[0] for r in crowded]
    for a, b in zip(alone, crowded, strict=True):
        assert a[1] == pytest.approx(b[1], abs=1e-5)


def test_a_context_that_parts_from_its_cache_is_read_from_where_they_part(tiny):
    model, tok = tiny
    pad, eot = tok.pad_token_id, tok.get_vocab()["<eot>"]
    cache = KVCache()
    first = [1, 11, 12, 13, 14, 15, 16]
    generate_turns(model, [Req(first, 4, None, None, cache)], pad, eot)
    edited = [*first[:3], 40, 41, *first[5:], 17, 18]  # not an extension of what the cache read
    kept = generate_turns(model, [Req(edited, 4, None, None, cache)], pad, eot)[0]
    reread = generate_turns(model, [Req(edited, 4, None, None)], pad, eot)[0]
    assert kept[0] == reread[0] and kept[1] == pytest.approx(reread[1], abs=1e-5)
    assert cache.ids == edited + kept[0][:-1] and cache.kv.shape[3] == len(cache.ids)
    # a context shorter than what the cache holds, and one equal to it: the last token is read again either way
    again = generate_turns(model, [Req(list(edited), 4, None, None, cache)], pad, eot)[0]
    assert again[0] == kept[0] and again[1] == pytest.approx(kept[1], abs=1e-5)
    same = list(cache.ids)
    kept = generate_turns(model, [Req(same, 4, None, None, cache)], pad, eot)[0]
    reread = generate_turns(model, [Req(same, 4, None, None)], pad, eot)[0]
    assert kept[0] == reread[0] and kept[1] == pytest.approx(reread[1], abs=1e-5)


def test_negotiations_play_the_same_with_a_kept_cache_and_rereading(tiny, widget_scenario):
    from nego.agents.compact.protocol import CompactFactory, CompactPolicy
    from nego.market.marketplace import Job
    from nego.training.rollout import split_scenarios
    from nego.training.runner import EpisodeRunner

    model, tok = tiny
    scenarios = [widget_scenario, *split_scenarios("dev", 3, 5)]
    jobs = [Job(sc, "learner", buyer, seed) for sc in scenarios for buyer, seed in (("tft", 1), ("timedep:e=1", 2))]
    traces = {}
    for keep in (True, False):
        policy = CompactPolicy(model, tok, keep_cache=keep)
        assert policy.keep_cache is keep
        with EpisodeRunner({"learner": CompactFactory("learner", policy, 1.0)}) as runner:
            traces[keep] = [r.trace for r in runner.rollouts(jobs)]
    assert max(len(t.completion_ids) for t in traces[True]) > 30  # several turns each
    for a, b in zip(traces[True], traces[False], strict=True):
        assert a.completion_ids == b.completion_ids and a.mask == b.mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_models_of_another_shape_reread_every_turn(tiny):
    from nego.agents.compact.protocol import CompactPolicy
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tok = tiny
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=256))
    policy = CompactPolicy(gpt2, tok)
    assert not policy.keep_cache and policy.new_cache() is None
