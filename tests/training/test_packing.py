"""The GRPO loss read in length buckets equals TRL's padded batch: loss, gradients and the log-probabilities of the
importance ratio and the KL, for the tiny model and tiny Llama and Gemma 4 chat models built here, under every loss
type nego offers; a seeded run repeats its rewards step for step.

Tolerance (float32 on a CPU): the loss within 1e-6 of the padded one (relative to max(1, |loss|)), every gradient
entry within 1e-5 of the largest padded gradient entry, log-probabilities and entropies within 1e-5 absolute.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nego.training.config import LOSS_TYPES, TrainConfig
from nego.training.packing import agreed, plan_batch, plan_buckets, row_spans, split_buckets
from nego.training.trainer import build_grpo_trainer, grpo_args

from .chat_models import tiny_chat_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MODELS = ("tiny", "llama", "gemma4")
LOSS_RTOL = 1e-6
GRAD_RTOL = 1e-5
LOGP_ATOL = 1e-5


def _cost(buckets: list[list[int]], lengths: list[int], call: int) -> int:
    return sum(len(b) * max(lengths[i] for i in b) + call for b in buckets)


def _least_cost(lengths: list[int], max_rows: int, call: int) -> int:
    """Every way of cutting the rows, sorted by length, into buckets of at most ``max_rows``."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    best = None
    for cuts in itertools.product((False, True), repeat=len(order) - 1):
        buckets, current = [], [order[0]]
        for cut, i in zip(cuts, order[1:], strict=True):
            if cut:
                buckets.append(current)
                current = []
            current.append(i)
        buckets.append(current)
        if max(map(len, buckets)) <= max_rows:
            cost = _cost(buckets, lengths, call)
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    max_rows=st.integers(1, 9),
    call=st.integers(0, 60),
)
def test_buckets_hold_every_row_once_in_length_order_at_the_least_cost(lengths, max_rows, call):
    buckets = plan_buckets(lengths, max_rows=max_rows, call_tokens=call)
    assert [i for b in buckets for i in b] == sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    assert all(1 <= len(b) <= max_rows for b in buckets)
    assert _cost(buckets, lengths, call) == _least_cost(lengths, max_rows, call)


@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12), extra=st.integers(0, 12))
def test_buckets_split_into_more_keep_every_row_once_in_order(lengths, extra):
    buckets = plan_buckets(lengths, max_rows=4, call_tokens=10)
    count = min(len(lengths), len(buckets) + extra)
    split = split_buckets(buckets, count)
    assert len(split) == count and all(split)
    assert [i for b in split for i in b] == [i for b in buckets for i in b]
    with pytest.raises(ValueError):
        split_buckets(buckets, len(lengths) + 1)


def test_processes_sharding_a_model_read_as_many_buckets_as_the_one_with_most_or_all_read_trls_way():
    mask = torch.ones(6, 10, dtype=torch.long)
    mask[:3, 7:] = 0
    plan = plan_batch(mask, 5, max_rows=6, call_tokens=0)
    assert plan is not None and len(plan.buckets) == 2
    handed: list[int] = []

    def counts(others: list[int]):
        return lambda mine: handed.append(mine) or [mine, *others]

    wider = agreed(plan, counts([4]))
    assert wider is not None and len(wider.buckets) == 4 and handed == [2]
    assert [i for b in wider.buckets for i in b] == [i for b in plan.buckets for i in b]
    assert agreed(plan, counts([1])).buckets == plan.buckets
    assert agreed(plan, counts([0])) is None  # another process reads TRL's way: so does this one
    assert agreed(None, counts([3])) is None and handed[-1] == 0


def test_a_row_is_one_run_of_attended_columns_with_a_prompt_token():
    spans = row_spans(torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 0, 0], [0, 1, 0, 0, 0]]), prompt_width=2)
    assert spans is not None and spans.start.tolist() == [1, 0, 1] and spans.end.tolist() == [4, 3, 2]
    assert row_spans(torch.tensor([[1, 1, 0, 1, 0]]), prompt_width=2) is None  # a hole
    assert row_spans(torch.tensor([[0, 0, 1, 1, 0]]), prompt_width=2) is None  # no prompt token
    assert row_spans(torch.tensor([[1, 1, 0]]), prompt_width=0) is None  # no prompt column at all


def _trainer(kind: str, tmp) -> object:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if kind == "tiny":
        from nego.training.tiny_model import build_tiny_model
        from nego.training.tokenizer import build_tokenizer

        tok = build_tokenizer()
        model = build_tiny_model(tok, seed=0)
    else:
        path = tiny_chat_model(tmp / "model", kind)
        model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    cfg = TrainConfig(group_size=2, scenarios_per_step=3, max_tokens=128)
    args = grpo_args(cfg, tmp / "out", gradient_checkpointing=False)
    trainer = build_grpo_trainer(model, tok, args, prompts=["a", "b", "c"], rollout_func=lambda p, t: {}, callbacks=[])
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop, which these tests do not run
    trainer.model.train()
    return trainer


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    built: dict[str, object] = {}

    def get(kind: str):
        if kind not in built:
            built[kind] = _trainer(kind, tmp_path_factory.mktemp(kind))
        return built[kind]

    return get


# (prompt tokens, completion tokens, completion attended): a one-token reply, a reply TRL masks as truncated, and
# one longer than the Gemma 4 model's sliding window
ROWS = [(5, 9, True), (2, 30, True), (7, 1, True), (3, 17, False), (6, 22, True), (1, 12, True), (4, 90, True)]


def _batch(vocab: int, rows=ROWS, seed: int = 1) -> dict[str, torch.Tensor]:
    """A batch laid out as TRL lays it out: prompts left-padded, completions right-padded, buyer tokens out of the
    loss (``tool_mask``), old log-probabilities off the current policy's so the ratio is not 1."""
    g = torch.Generator().manual_seed(seed)
    n, width_p, width_c = len(rows), max(r[0] for r in rows), max(r[1] for r in rows)
    prompt_ids = torch.zeros(n, width_p, dtype=torch.long)
    prompt_mask = torch.zeros(n, width_p, dtype=torch.long)
    completion_ids = torch.zeros(n, width_c, dtype=torch.long)
    completion_mask = torch.zeros(n, width_c, dtype=torch.long)
    tool_mask = torch.ones(n, width_c, dtype=torch.long)
    for i, (p, c, attended) in enumerate(rows):
        prompt_ids[i, width_p - p :] = torch.randint(3, vocab, (p,), generator=g)
        prompt_mask[i, width_p - p :] = 1
        completion_ids[i, :c] = torch.randint(3, vocab, (c,), generator=g)
        completion_mask[i, :c] = int(attended)
        tool_mask[i, :c] = (torch.rand(c, generator=g) < 0.7).long()
    loss_mask = completion_mask * tool_mask
    return dict(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        tool_mask=tool_mask,
        advantages=torch.randn(n, generator=g),
        num_items_in_batch=loss_mask.sum(),
        noise=0.3 * torch.randn(n, width_c, generator=g),
        ref_noise=0.3 * torch.randn(n, width_c, generator=g),
    )


def _tokens_read(model, run) -> tuple[object, int]:
    """``run()``'s result and the number of token positions the model's embedding read."""
    seen = [0]

    def count(module, args, out):
        seen[0] += args[0].numel()

    handle = model.get_input_embeddings().register_forward_hook(count)
    try:
        return run(), seen[0]
    finally:
        handle.remove()


def _logps(trainer, batch, pack: bool, batch_size: int | None = None):
    trainer.pack = pack
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width_c = batch["completion_ids"].size(1)
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, mask, width_c, batch_size=batch_size, compute_entropy=True
    )
    return logps, entropies


def _loss_and_grads(trainer, batch, pack: bool):
    with torch.no_grad():
        logps, _ = _logps(trainer, batch, pack=False)
    inputs = {k: v for k, v in batch.items() if k not in ("noise", "ref_noise")}
    inputs["old_per_token_logps"] = logps + batch["noise"]
    inputs["ref_per_token_logps"] = logps + batch["ref_noise"]
    trainer.pack = pack
    trainer.model.zero_grad()
    loss, read = _tokens_read(trainer.model, lambda: trainer._compute_loss(trainer.model, inputs))
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return float(loss), grads, read


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_the_bucketed_loss_and_gradients_equal_the_padded_batchs(trainers, kind, loss_type, beta):
    trainer = trainers(kind)
    trainer.loss_type, trainer.beta = loss_type, beta
    batch = _batch(trainer.model.config.vocab_size)
    padded_loss, padded_grads, padded_read = _loss_and_grads(trainer, batch, pack=False)
    loss, grads, read = _loss_and_grads(trainer, batch, pack=True)
    assert abs(loss - padded_loss) <= LOSS_RTOL * max(1.0, abs(padded_loss))
    assert padded_grads.abs().max() > 0
    assert float((grads - padded_grads).abs().max()) <= GRAD_RTOL * float(padded_grads.abs().max())
    real = sum(p + (c if attended else 0) for p, c, attended in ROWS)
    assert real <= read < padded_read  # the buckets were read, not the padded matrix


@pytest.mark.parametrize("kind", MODELS)
def test_the_log_probabilities_of_the_ratio_and_the_kl_equal_the_padded_batchs(trainers, kind):
    """The old policy's and the reference model's log-probabilities are read in TRL's batch-size chunks, without
    gradient; bucketed, they and the entropies agree, and are zero where TRL's are (outside the attended reply)."""
    trainer = trainers(kind)
    batch = _batch(trainer.model.config.vocab_size, seed=2)
    with torch.no_grad():
        padded_logps, padded_entropies = _logps(trainer, batch, pack=False, batch_size=4)
        logps, entropies = _logps(trainer, batch, pack=True, batch_size=4)
    assert logps.shape == padded_logps.shape
    assert float((logps - padded_logps).abs().max()) <= LOGP_ATOL
    assert float((entropies - padded_entropies).abs().max()) <= LOGP_ATOL
    assert torch.equal(logps == 0, padded_logps == 0)


def test_buckets_cut_further_to_agree_with_other_processes_read_the_same_numbers(trainers, monkeypatch):
    trainer = trainers("llama")
    batch = _batch(trainer.model.config.vocab_size, seed=3)
    with torch.no_grad():
        padded_logps, _ = _logps(trainer, batch, pack=False)
        monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))
        monkeypatch.setattr(trainer, "_bucket_counts", lambda mine: [mine, len(ROWS)])
        logps, read = _tokens_read(trainer.model, lambda: _logps(trainer, batch, pack=True)[0])
    assert read == sum(max(2, p + (c if attended else 0)) for p, c, attended in ROWS)  # one row per bucket
    assert float((logps - padded_logps).abs().max()) <= LOGP_ATOL


def test_a_batch_the_buckets_do_not_cover_is_read_as_trl_reads_it(trainers):
    """A row without a prompt token (never produced by nego's rollouts) is read TRL's way, bit for bit."""
    trainer = trainers("tiny")
    batch = _batch(trainer.model.config.vocab_size, rows=[(0, 6, True), (3, 4, True)])
    with torch.no_grad():
        padded = _logps(trainer, batch, pack=False)
        packed = _logps(trainer, batch, pack=True)
    assert torch.equal(padded[0], packed[0]) and torch.equal(padded[1], packed[1])


@pytest.mark.slow
def test_a_seeded_run_with_the_bucketed_loss_repeats_its_rewards_step_for_step():
    from nego.training.sanity import run_sanity, warm_start

    cfg = TrainConfig(
        train_buyers=["timedep:e=3"],
        train_scenarios=4,
        scenarios_per_step=2,
        group_size=4,
        steps=3,
        max_rounds=2,
        sft_episodes=32,
        sft_steps=10,
        sft_sellers=["random"],
        sft_batch=16,
        lr=3e-3,
        eval_every=0,
        save_every=0,
        time_budget_min=0,
        threads=1,
        seed=0,
    ).validate()
    assert cfg.pack
    model, tok, _ = warm_start(cfg)
    first, second = (run_sanity(cfg, model, tok, "outcome") for _ in range(2))
    assert len(first.rewards) == cfg.steps
    assert first.rewards == second.rewards
    assert [row["loss"] for row in first.logs] == [row["loss"] for row in second.logs]
    assert any(row["grad_norm"] > 0 for row in first.logs)  # the steps did update the policy


@pytest.mark.slow
def test_two_processes_make_the_same_model_calls_though_their_rows_fall_into_different_buckets(tmp_path):
    """Processes sharding one model (FSDP) must call it the same number of times: each gathers the weights."""
    accelerate = Path(sys.executable).with_name("accelerate")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # --multi_gpu is accelerate's multi-process (torchrun) launcher; the processes themselves run on CPU with gloo
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port)]
    cmd += [str(Path(__file__).with_name("packing_run.py")), str(tmp_path)]
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for name in ("covered", "uncovered"):
        assert ranks[0][name]["calls"] == ranks[1][name]["calls"], (name, ranks)
        assert all(r[name]["gap"] <= LOGP_ATOL for r in ranks)
    assert ranks[0]["covered"]["calls"] > 1  # the first process split its one bucket to match the second
    assert ranks[0]["uncovered"]["calls"] == 1  # both read TRL's way: one call for the batch
