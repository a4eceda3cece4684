"""The rows :func:`~nego.training.rollout.to_trl` hands TRL, through a real GRPO step on a tiny random Llama: an
episode in which the seller never spoke (an empty trace) trains like any row kept out of the loss."""

from __future__ import annotations

import math

import pytest
from nego.agents.trace import TokenTrace
from nego.training.rollout import filler_id, to_trl, trl_reward
from nego.training.runner import Sample

from .chat_models import tiny_chat_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EMPTY = TokenTrace((), (), (), ())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("model") / "m")


def spoke(tok, prompt: str = "hello there", reply: str = "a fair offer") -> TokenTrace:
    """A seller that wrote ``reply`` (trained) and the closing EOS (context)."""
    ids = tok(reply, add_special_tokens=False)["input_ids"]
    return TokenTrace(
        tuple(tok(prompt)["input_ids"]), (*ids, tok.eos_token_id), (1,) * len(ids) + (0,), (-1.0,) * len(ids) + (0.0,)
    )


def grpo_step(checkpoint, tmp_path, samples: list[Sample]):
    """One GRPO step (one group of two) on ``samples`` through ``to_trl``; returns the trainer and the weights."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=len(samples),
        num_generations=len(samples),
        learning_rate=1e-2,
        beta=0.0,
        loss_type="dapo",
        max_completion_length=16,
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    torch.manual_seed(0)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(checkpoint),
        reward_funcs=trl_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "scenario"}]),
        processing_class=tok,
        rollout_func=lambda prompts, trainer: to_trl(samples, 16, filler_id(tok)),
    )
    trainer.train()
    return trainer, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_an_empty_episode_gets_one_filler_id_out_of_the_loss_and_other_rows_are_unchanged(checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    full, over = spoke(tok), spoke(tok, reply="a fair offer, and a much longer reply than the cap allows")
    cap = len(full.completion_ids)
    rows = to_trl([Sample("a", "s", EMPTY, 0.4), Sample("b", "s", full, 0.1), Sample("c", "s", over, 0.2)], cap, 7)
    assert rows["prompt_ids"] == [[7], list(full.prompt_ids), list(over.prompt_ids)]
    assert rows["completion_ids"] == [[7], list(full.completion_ids), list(over.completion_ids[:cap])]
    assert rows["env_mask"] == [[0], list(full.mask), [0] * cap]
    assert rows["logprobs"] == [[0.0], list(full.logprobs), list(over.logprobs[:cap])]
    assert rows["reward"] == [0.4, 0.1, 0.2] and rows["over_cap"] == [False, False, True]
    assert filler_id(tok) == tok.pad_token_id != tok.eos_token_id  # TRL counts a pad id as a finished reply


def test_an_episode_without_seller_tokens_trains_its_group_like_any_masked_row(checkpoint, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    full = spoke(tok)
    masked = TokenTrace((5, 6), (8, 9, tok.eos_token_id), (0, 0, 0), (0.0, 0.0, 0.0))  # spoke, nothing trainable
    trainer, empty_after = grpo_step(
        checkpoint, tmp_path / "empty", [Sample("a", "s", EMPTY, 0.4), Sample("b", "s", full, 0.1)]
    )
    logged = trainer.state.log_history[0]
    assert logged["reward"] == pytest.approx(0.25) and logged["reward_std"] > 0  # the empty episode's reward counts
    assert math.isfinite(logged["loss"]) and logged["grad_norm"] > 0  # the other row learned from the advantage
    _, masked_after = grpo_step(
        checkpoint, tmp_path / "masked", [Sample("a", "s", masked, 0.4), Sample("b", "s", full, 0.1)]
    )
    assert all(empty_after[k].allclose(masked_after[k], rtol=0, atol=1e-6) for k in empty_after)


def test_a_batch_of_empty_episodes_steps_without_moving_the_weights(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    trainer, after = grpo_step(checkpoint, tmp_path, [Sample("a", "s", EMPTY, 0.4), Sample("b", "s", EMPTY, 0.1)])
    logged = trainer.state.log_history[0]
    assert logged["loss"] == 0.0 and logged["grad_norm"] == 0.0
    assert all(before[k].equal(after[k]) for k in before)
