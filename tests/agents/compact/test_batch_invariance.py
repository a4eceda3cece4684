"""The compact model plays a negotiation the same whatever else the run plays: alone at concurrency 1, batched with
every other negotiation, beside rule sellers, in another order; float rounding that depends on the batch cannot
move a token; and the log-probabilities recorded at sampling are the ones the GRPO trainer recomputes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from nego.agents import token_choice  # noqa: E402
from nego.agents.compact.protocol import CompactFactory, CompactPolicy  # noqa: E402
from nego.market.marketplace import Job  # noqa: E402
from nego.training.rollout import split_scenarios  # noqa: E402
from nego.training.runner import EpisodeRunner  # noqa: E402

from ..trainer_recompute import largest_gap, lone_logprobs, trainer_logprobs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SKEW_MARGIN = 0.05
"""The margin the skew tests decide with: wide, so that a skew just under its half would move many tokens were close
choices not made again alone (how the choice works does not depend on the margin's size)."""
LEARNER = "learner"
BUYERS = ("tft", "hazard")
TEMPERATURE = 1.0
TRAINER_TOLERANCE = 1e-4
"""How far a recorded log-probability may be from the trainer's recomputation, padded or alone (float32 rounding of
two batch layouts: up to 3e-5 measured, on the warm-started model too)."""


@pytest.fixture
def wide_margin(monkeypatch):
    monkeypatch.setattr(token_choice, "MARGIN", SKEW_MARGIN)


@pytest.fixture(scope="module")
def tiny():
    from nego.training.tiny_model import build_tiny_model
    from nego.training.tokenizer import build_tokenizer

    tok = build_tokenizer()
    return build_tiny_model(tok, seed=0).eval(), tok


@pytest.fixture(scope="module")
def jobs():
    scenarios = split_scenarios("dev", 4, 5)
    return [Job(sc, LEARNER, buyer, 500 + i) for i, sc in enumerate(scenarios) for buyer in BUYERS]


def play(model, tok, jobs, *, keep: bool = True, concurrency: int = 1024, rules: bool = False):
    """Each learner job's (outcome, turns without timings, trace) by negotiation id, and the forward calls made."""
    sellers = (LEARNER, "tft", "linear") if rules else (LEARNER,)  # rule sellers on the same slots, interleaved
    policy = CompactPolicy(model, tok, keep_cache=keep)
    factory = CompactFactory(LEARNER, policy, TEMPERATURE)
    with EpisodeRunner({LEARNER: factory}, concurrency=concurrency) as runner:
        played = runner.play([Job(j.scenario, seller, j.buyer, j.seed) for j in jobs for seller in sellers])
    out = {}
    for p in played:
        if p.job.seller == LEARNER:
            turns = tuple((t.round, t.role, t.attempt, t.action.kind, t.action.raw, t.valid) for t in p.result.turns)
            out[p.job.negotiation_id] = (p.result.outcome, turns, p.seller_record)
    return out, policy.forward_calls


def assert_same_play(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for nid in a:
        (outcome_a, turns_a, trace_a), (outcome_b, turns_b, trace_b) = a[nid], b[nid]
        assert turns_a == turns_b, nid
        assert outcome_a == outcome_b, nid
        assert trace_a.completion_ids == trace_b.completion_ids, nid
        assert trace_a.logprobs == pytest.approx(trace_b.logprobs, abs=TRAINER_TOLERANCE), nid


@pytest.fixture(scope="module")
def alone(tiny, jobs):
    """The jobs played one at a time, each negotiation's turns in batches of one."""
    model, tok = tiny
    return play(model, tok, jobs, concurrency=1)


def test_negotiations_play_the_same_alone_batched_beside_other_sellers_and_in_another_order(tiny, jobs, alone):
    model, tok = tiny
    (one_by_one, alone_calls), (batched, batched_calls) = alone, play(model, tok, jobs)
    assert batched_calls < alone_calls / 4  # the default run does batch its negotiations
    assert_same_play(one_by_one, batched)
    assert_same_play(one_by_one, play(model, tok, jobs, rules=True)[0])
    assert_same_play(one_by_one, play(model, tok, jobs[::-1], concurrency=3)[0])
    assert sum(len(turns) for _, turns, _ in one_by_one.values()) > 4 * len(jobs)  # several turns each


def test_rereading_each_context_plays_the_same_batched_and_beside_other_sellers(tiny, jobs, alone):
    model, tok = tiny
    assert_same_play(alone[0], play(model, tok, jobs, keep=False)[0])
    assert_same_play(alone[0], play(model, tok, jobs, keep=False, rules=True)[0])


class BatchSkew:
    """A forward hook on the output head that moves every logit by +-``SKEW_MARGIN / 2`` (just under), signs drawn from
    the number of rows the pass holds, and leaves a pass of one row alone: a stand-in for kernels whose rounding
    depends on the batch, as large as the margin allows."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def offsets(self, rows: int) -> torch.Tensor:
        if rows == 1:
            return torch.zeros(self.vocab)
        signs = torch.randint(0, 2, (self.vocab,), generator=torch.Generator().manual_seed(rows)) * 2 - 1
        return signs * (SKEW_MARGIN / 2) * 0.95

    def __call__(self, module, inputs, out):
        return out + self.offsets(out.shape[0]).to(out.dtype)


@pytest.mark.parametrize("keep", [True, False], ids=["kept cache", "re-read"])
def test_rounding_that_depends_on_the_batch_cannot_move_a_token(tiny, keep, wide_margin):
    """48 rows of 40 sampled tokens, decoded together with and without the skew: the same tokens (were choices made
    on the batched logits alone, about 20 of the 48 rows would move)."""
    from nego.agents.compact.protocol import KVCache, _Request, generate_turns

    model, tok = tiny
    rng = torch.Generator().manual_seed(3)
    contexts = [torch.randint(5, len(tok), (4 + row % 9,), generator=rng).tolist() for row in range(48)]

    def run() -> list[list[int]]:
        batch = [
            _Request(ctx, 40, TEMPERATURE, torch.Generator().manual_seed(row), KVCache() if keep else None)
            for row, ctx in enumerate(contexts)
        ]
        return [ids for ids, _ in generate_turns(model, batch, tok.pad_token_id, stop_id=-1)]

    plain = run()
    handle = model.lm_head.register_forward_hook(BatchSkew(model.config.vocab_size))
    try:
        skewed = run()
    finally:
        handle.remove()
    assert skewed == plain
    assert all(len(ids) == 40 for ids in plain)


def test_recorded_logprobs_are_the_ones_the_trainer_recomputes(tiny, alone):
    model, tok = tiny
    traces = [trace for _, _, trace in alone[0].values()]
    padded, trained = largest_gap(traces, trainer_logprobs(model, traces, TEMPERATURE, tok.pad_token_id))
    assert padded < TRAINER_TOLERANCE
    assert largest_gap(traces, [lone_logprobs(model, t, TEMPERATURE) for t in traces])[0] < TRAINER_TOLERANCE
    assert trained > 10 * len(traces)
