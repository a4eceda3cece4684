"""The in-process chat engine generates a row the same whatever it is batched with: float rounding that depends on
the batch cannot move a token on either generation path, negotiations play the same alone, batched and beside other
sellers, and the log-probabilities recorded at sampling are the ones the GRPO trainer recomputes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from nego.agents import token_choice  # noqa: E402
from nego.agents.llm.backends.hf_engine import GenerationEngine, Row, end_ids  # noqa: E402
from nego.market.marketplace import Job  # noqa: E402
from nego.market.protocol import ProtocolConfig  # noqa: E402
from nego.training.chat_rollout import ChatFactory, ChatPolicy  # noqa: E402
from nego.training.rollout import split_scenarios  # noqa: E402
from nego.training.runner import EpisodeRunner  # noqa: E402

from ...training.chat_models import tiny_chat_model  # noqa: E402
from ..trainer_recompute import largest_gap, lone_logprobs, trainer_logprobs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SKEW_MARGIN = 0.05
"""The margin the skew tests decide with: wide, so that a skew just under its half would move many tokens were close
choices not made again alone (how the choice works does not depend on the margin's size)."""
LEARNER = "learner"
LONE_TOLERANCE = 2e-5
"""How far a recorded log-probability may be from the sequence's recomputation alone (up to 5e-6 measured)."""
TRAINER_TOLERANCE = 5e-4
"""How far it may be from TRL's recomputation over a padded batch, whose own rounding grows with the padding (up to
1.7e-4 measured, on 2,400-token sequences of the Gemma 4 test model)."""


@pytest.fixture
def wide_margin(monkeypatch):
    monkeypatch.setattr(token_choice, "MARGIN", SKEW_MARGIN)


def load(kind: str, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_chat_model(tmp_path_factory.mktemp(kind), kind)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(model, tokenizer): a Llama, whose prompts the engine reads alone and decodes together on a CPU."""
    return load("llama", tmp_path_factory)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    """(model, tokenizer): a Gemma 4 with a sliding-window layer, which takes one left-padded ``generate`` call."""
    return load("gemma4", tmp_path_factory)


@pytest.fixture(params=["llama", "gemma4"])
def chat_model(request):
    return request.getfixturevalue(request.param)


class BatchSkew:
    """A forward hook on the output head that moves every logit by +-``SKEW_MARGIN / 2`` (just under), signs drawn from
    the number of rows the pass holds, and leaves a pass of one row alone: a stand-in for kernels whose rounding
    depends on the batch, as large as the margin allows at temperatures of 1 and above (the race compares
    logits / T)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __call__(self, module, inputs, out):
        if out.shape[0] == 1:
            return out
        signs = torch.randint(0, 2, (self.vocab,), generator=torch.Generator().manual_seed(out.shape[0])) * 2 - 1
        return out + (signs * (SKEW_MARGIN / 2) * 0.95).to(out.dtype)


def rows(vocab: int) -> list[Row]:
    """48 prompts of different lengths (left padding), sampled and greedy rows, 48 new tokens each."""
    rng = torch.Generator().manual_seed(5)
    return [
        Row(torch.randint(5, vocab, (6 + 5 * (i % 7),), generator=rng).tolist(), 48, (1.0, 1.3, 0.0, 1.0)[i % 4], i)
        for i in range(48)
    ]


@pytest.mark.parametrize("kind, split", [("llama", True), ("llama", False), ("gemma4", False)])
def test_rounding_that_depends_on_the_batch_cannot_move_a_token(request, kind, split, wide_margin):
    """The rows generated together with and without the skew: the same tokens (were choices made on the batched
    logits alone, about 20 of the 48 rows would move)."""
    model, tok = request.getfixturevalue(kind)
    batch = rows(len(tok))

    def run():
        # an id the model never writes ends a row: every row runs its 48 tokens
        engine = GenerationEngine(model, eos_ids=(len(tok) + 1,), pad_id=tok.pad_token_id, split_prefill=split)
        return engine, [g.ids for g in engine.generate(batch)]

    _, plain = run()
    handle = model.lm_head.register_forward_hook(BatchSkew(model.config.vocab_size))
    try:
        engine, skewed = run()
    finally:
        handle.remove()
    assert skewed == plain
    assert all(len(ids) == 48 for ids in plain)
    assert engine.stats.lone_reads > 0  # close choices were made again alone


def test_a_row_generates_the_same_alone_in_any_batch_and_in_any_place(chat_model):
    model, tok = chat_model
    engine = GenerationEngine(model, eos_ids=end_ids(model, tok), pad_id=tok.pad_token_id)
    batch = rows(len(tok))[:10]
    alone = [engine.generate([r])[0] for r in batch]
    together = engine.generate(batch)
    shuffled = engine.generate(batch[::-1])[::-1]
    halves = engine.generate(batch[:3]) + engine.generate(batch[3:])
    for got in (together, shuffled, halves):
        assert [g.ids for g in got] == [g.ids for g in alone]
        for g, a in zip(got, alone, strict=True):
            assert g.logprobs == pytest.approx(a.logprobs, abs=LONE_TOLERANCE)
    assert len({g.ids for g in alone}) > 1


@pytest.fixture(scope="module")
def jobs():
    scenarios = split_scenarios("dev", 2, 3)
    return [Job(sc, LEARNER, buyer, 40 + i) for i, sc in enumerate(scenarios) for buyer in ("tft", "hazard")]


def play(model, tok, jobs, *, concurrency: int = 1024, rules: bool = False, temperature: float = 1.0):
    """Each learner job's (outcome, turns without timings, trace) by negotiation id, and the engine's calls."""
    policy = ChatPolicy(model, tok, max_new=12)
    extra = [Job(j.scenario, seller, j.buyer, j.seed) for j in jobs for seller in ("tft", "linear")] if rules else []
    factory = ChatFactory(LEARNER, policy, temperature)
    runner = EpisodeRunner({LEARNER: factory}, concurrency=concurrency)
    runner.market.protocol = ProtocolConfig(max_retries=1)
    with runner:
        played = runner.play([*jobs, *extra])
    out = {}
    for p in played:
        if p.job.seller == LEARNER:
            turns = tuple((t.round, t.role, t.attempt, t.action.kind, t.action.raw, t.valid) for t in p.result.turns)
            out[p.job.negotiation_id] = (p.result.outcome, turns, p.seller_record)
    return out, policy.generator.stats


def test_negotiations_play_the_same_alone_batched_beside_other_sellers_and_in_another_order(llama, jobs):
    model, tok = llama
    alone, alone_stats = play(model, tok, jobs, concurrency=1)
    assert alone_stats.largest_batch == 1
    for concurrency, rules, order in ((1024, False, jobs), (1024, True, jobs), (2, False, jobs[::-1])):
        other, stats = play(model, tok, order, concurrency=concurrency, rules=rules)
        assert other.keys() == alone.keys()
        for nid, (outcome, turns, trace) in alone.items():
            assert other[nid][1] == turns and other[nid][0] == outcome, nid
            assert other[nid][2].completion_ids == trace.completion_ids, nid
            assert other[nid][2].logprobs == pytest.approx(trace.logprobs, abs=LONE_TOLERANCE), nid
    assert stats.largest_batch > 1
    assert sum(len(turns) for _, turns, _ in alone.values()) > 3 * len(jobs)


def test_recorded_logprobs_are_the_ones_the_trainer_recomputes(chat_model, jobs):
    model, tok = chat_model
    temperature = 0.7
    played, _ = play(model, tok, jobs, temperature=temperature)
    traces = [trace for _, _, trace in played.values()]
    alone, trained = largest_gap(traces, [lone_logprobs(model, t, temperature) for t in traces])
    assert alone < LONE_TOLERANCE
    assert largest_gap(traces, trainer_logprobs(model, traces, temperature, tok.pad_token_id))[0] < TRAINER_TOLERANCE
    assert trained > 10 * len(traces)
